"""Hugging Face ``transformers`` causal language models on PyTorch.

Why one module past 500 lines: one adapter class (its cache, its trees of drafts in one
pass with a 4-D mask, its text) whose docstrings document what users meet; the shared
cache logic is ``_cached.py``, the tree scoring ``_tree_scoring.py``.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from specdec._cores import check_threads
from specdec.models._cached import PrefixCachedModel, common_prefix_length
from specdec.models._optional import import_optional
from specdec.models._text import check_messages, encode_chat_ids, end_of_turn_id
from specdec.models._tree_scoring import score_tree_by_branches, tree_arguments

__all__ = ["TransformersModel"]


class TransformersModel(PrefixCachedModel):
    """A ``transformers`` causal LM as a prefix-caching ``specdec`` model.

    The model's key/value cache (a ``transformers.DynamicCache``, or the
    legacy per-layer tuples of models that predate it) is kept between calls.
    Each :meth:`forward` call crops it to the longest common prefix of the new
    sequence and the cached one and runs the model on the remaining tokens
    only, under :func:`torch.inference_mode`. Tested with transformers 4.45
    and 5.24.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal language model whose ``forward`` accepts a cache
        (``cache=`` in recent transformers, ``past_key_values=`` in older
        ones). It is put in evaluation mode (dropout off) and moved to
        ``device``.
    device : str or torch.device, default "cpu"
        Where the model and its inputs live.
    tokenizer : transformers.PreTrainedTokenizerBase, optional
        The model's tokenizer.  With it the adapter has :meth:`tokenize`,
        :meth:`detokenize` and :attr:`eos_token_id` like
        :class:`~specdec.models.LlamaCppModel`, so that code driving either
        adapter can treat them alike.
    cost_curve : array_like of float, optional
        Time of a pass over ``i + 1`` new tokens relative to one token
        (element 0 is 1.0); given, it replaces the calibration that
        :attr:`cost_curve` otherwise runs on first access.
    tree_cost_curve : array_like of float, optional
        The same for a tree of drafts scored in one pass (:meth:`forward_tree`):
        element ``i`` is a pass over the last token and ``i`` nodes; given, it
        replaces the calibration of :attr:`tree_cost_curve`.
    n_threads : int, optional
        Sets torch's intra-op threads (``torch.set_num_threads``, which holds for
        the whole process, every model in it included).  Unset, torch's own default
        stays (one thread per core).  On a machine where other busy work shares
        the cores, give the number of cores actually free.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The wrapped model.
    tokenizer : transformers.PreTrainedTokenizerBase or None
        The tokenizer given at creation.
    device : torch.device
        Device of the model and of its inputs.
    vocab_size : int
        Number of logits per position, ``V`` (the output layer's size).
    n_evaluated_tokens : int
        Total number of tokens pushed through the model since creation or the
        last :meth:`reset`.
    n_forward_calls : int
        Number of :meth:`forward` calls since creation or the last :meth:`reset`.
    cost_curve : numpy.ndarray
        Relative cost of a pass over 1..16 new tokens (see
        :attr:`PrefixCachedModel.cost_curve`); measured per model name, dtype,
        device and ``torch.get_num_threads()`` (not shared between adapters when
        the model's config has no name).

    Raises
    ------
    ImportError
        If ``torch`` or ``transformers`` is not installed.
    ValueError
        If ``cost_curve`` is not a valid curve, or ``n_threads`` is outside
        [1, 4096].
    TypeError
        If ``n_threads`` is not an int.

    Notes
    -----
    Logits of positions that are already cached are not stored, so when the
    caller asks for more trailing rows than there are new tokens (or for all
    rows, by omitting ``logits_to_keep``) the cache is rolled back further and
    those positions are computed again. The decoder asks for exactly the new
    positions in the usual case, so this costs nothing there; a caller that
    always wants all ``L`` rows pays a full forward pass per call.

    If the cache cannot be cropped (some sliding-window or recurrent layers
    cannot), a rollback starts over from an empty cache instead.
    """

    def __init__(
        self,
        model: Any,
        device: Any = "cpu",
        *,
        tokenizer: Any = None,
        cost_curve: Any = None,
        tree_cost_curve: Any = None,
        n_threads: int | None = None,
    ) -> None:
        n_threads = check_threads(n_threads, "n_threads")
        super().__init__(cost_curve, tree_cost_curve)
        torch = import_optional("torch", "TransformersModel", "transformers")
        self._torch = torch
        if n_threads is not None:
            torch.set_num_threads(n_threads)
        self._DynamicCache = import_optional(
            "transformers", "TransformersModel", "transformers"
        ).DynamicCache
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        # Dropout in training mode would make the logits random.
        self.model = model.to(self.device).eval()
        params = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed the ``past_key_values`` argument to ``cache``
        # (the old name still works there, with a deprecation warning).
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # ``logits_to_keep`` was ``num_logits_to_keep`` before transformers 4.50;
        # some models have neither and return every row.
        self._keep_arg = next(
            (a for a in ("logits_to_keep", "num_logits_to_keep") if a in params), None
        )
        # transformers 4.x flags models that still use the legacy tuple cache
        # (such as GPT-2 before 4.47): they get no cache object from us and
        # their returned tuples are cropped by slicing. transformers 5 dropped
        # both the flag and the tuples.
        self._cache_objects = bool(getattr(self.model, "_supports_cache_class", True))
        out_emb = (
            self.model.get_output_embeddings()
            if hasattr(self.model, "get_output_embeddings")
            else None
        )
        if out_emb is not None and getattr(out_emb, "weight", None) is not None:
            # The output layer, not the config, decides the logits' width
            # (some models pad the embedding matrix).
            self.vocab_size = int(out_emb.weight.shape[0])
        else:
            self.vocab_size = int(self.model.config.vocab_size)
        self._tokens = np.zeros(0, dtype=np.int64)
        self._cache: Any = None
        self._attention_window = _attention_window(self.model.config)

    # -- cache bookkeeping -------------------------------------------------

    # -- the cache (see PrefixCachedModel) -----------------------------------

    def _cached_ids(self) -> np.ndarray:
        return self._tokens

    def _calibration_key(self) -> Any:
        name = getattr(self.model.config, "name_or_path", "") or ""
        if not name:
            return None  # a model built in memory: nothing tells two of them apart
        parameter = next(self.model.parameters(), None)
        dtype = str(parameter.dtype) if parameter is not None else "?"
        return ("transformers", name, dtype, str(self.device), self._torch.get_num_threads())

    def _new_cache(self) -> Any:
        if not self._cache_objects:
            return None  # the model makes a legacy tuple cache itself
        try:
            # Recent versions build per-layer caches (e.g. sliding windows)
            # from the config.
            return self._DynamicCache(config=self.model.config)
        except TypeError:
            return self._DynamicCache()

    @staticmethod
    def _cropped(cache: Any, n_keep: int, n_cached: int) -> Any:
        """``cache`` holding its first ``n_keep`` tokens only, or None if impossible."""
        if cache is None or n_keep <= 0:
            return None
        if hasattr(cache, "crop"):
            if not getattr(cache, "is_croppable", True):
                return None
            # A negative argument removes that many trailing tokens in every
            # transformers version that has ``crop`` (a positive one means
            # "keep this many" in 4.x but is rejected by 5.x); never pass 0,
            # which empties the cache in 4.x.
            try:
                cache.crop(n_keep - n_cached)
            except (RuntimeError, ValueError):
                # a sliding window's layer says it can be cropped but refuses once
                # the window is full: start over (some layers may be cut already)
                return None
            return cache
        if isinstance(cache, (tuple, list)):
            # Legacy format: per layer a (key, value) pair of tensors shaped
            # (batch, heads, sequence, head_dim).
            return tuple(tuple(t[..., :n_keep, :] for t in layer) for layer in cache)
        return None

    def _roll_back(self, n_keep: int) -> None:
        """Make the cache hold only its first ``n_keep`` tokens."""
        n_cached = self._tokens.shape[0]
        if n_keep >= n_cached:
            return
        self._cache = self._cropped(self._cache, n_keep, n_cached)
        # Without a cache (it could not be cropped) the model starts over.
        self._tokens = self._tokens[:n_keep] if self._cache is not None else self._tokens[:0]

    # -- public API --------------------------------------------------------

    def _first_to_evaluate(self, n_common: int, length: int, n_rows: int) -> int:
        # Start no later than L - n: the logits of cached positions are not
        # kept, so every wanted row must come from this call's evaluation.
        # This also handles a sequence that is entirely cached already.
        return min(n_common, length - n_rows)

    def _evaluate(self, seq: np.ndarray, start: int, n_rows: int) -> np.ndarray:
        torch = self._torch
        if self._cache is None:
            self._cache = self._new_cache()
        # A copy: torch warns about (and cannot protect) read-only buffers.
        new_ids = torch.tensor(seq[start:][None], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {"use_cache": True}
        if self._cache is not None:
            kwargs[self._cache_arg] = self._cache
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = n_rows
        try:
            with torch.inference_mode():
                out = self.model(new_ids, **kwargs)
                logits = out.logits[:, -n_rows:, :]
                result = logits.to(device="cpu", dtype=torch.float32).numpy().copy()
        except BaseException:
            # The cache may hold part of this call's tokens in some layers:
            # drop it rather than guess.
            self._cache = None
            self._tokens = self._tokens[:0]
            raise
        returned = out.get(self._cache_arg) if hasattr(out, "get") else None
        if returned is not None:
            # Cache objects are updated in place, but legacy tuples are new
            # on every call.
            self._cache = returned
        # A model that handed no cache back must start over next time.
        self._tokens = seq.copy() if self._cache is not None else self._tokens[:0]
        return result

    # -- a tree of drafts in one pass ------------------------------------------------

    #: Most candidates per tree the decoder builds for this model (any width works: the
    #: tree is one batch under a 4-D attention mask).
    tree_width = 4

    def forward_tree(self, prefix_ids: Any, token_ids: Any, parents: Any) -> np.ndarray:
        """Target rows of a tree of drafts after ``prefix_ids``, in one forward pass.

        The prefix's last token and every node go into one batch (its other uncached
        tokens, if any, through an ordinary pass first); a 4-D attention mask lets
        each node see the prefix and its own ancestors only, and its position
        id is its depth after the prefix, so every row is the row of evaluating its
        branch as a plain sequence.  Afterwards the cache keeps the prefix and the
        branch of the first nodes (``0, 1, ...`` while each is the previous one's
        child, as a tree built from candidates starts with the best one), so the next
        ``forward`` over the kept sequence reuses what it shares with that branch.

        Parameters
        ----------
        prefix_ids : array_like of int, shape (L,) or (1, L)
            The sequence before the tree, at least one token.
        token_ids, parents : array_like of int, shape (N,)
            The tree, as in :func:`specdec.verify_tree`.

        Returns
        -------
        numpy.ndarray
            float32 ``(N + 1, V)``: row 0 after the prefix, row ``i + 1`` after node ``i``.
        """
        prefix, tokens, par, paths = tree_arguments(prefix_ids, token_ids, parents, self.vocab_size)
        n = tokens.shape[0]
        if n == 0:
            return self.forward(prefix[None, :], logits_to_keep=1)[0]
        depth = np.array([len(path) for path in paths], dtype=np.int64)
        length = prefix.shape[0]
        self._check_fits(length + int(depth.max()))
        if length + int(depth.max()) > self._attention_window:
            # the tree's 4-D mask would let a node see past a sliding window (and
            # a window's cache holds fewer positions than the mask): branch by branch
            return score_tree_by_branches(self, prefix, tokens, par)
        if not self._first_use_done:
            self._first_use_done = True
            self._first_use()
        # The prefix's last token is evaluated again if cached: its row is row 0.
        self._roll_back(min(common_prefix_length(prefix, self._tokens), length - 1))
        first_new = self._tokens.shape[0]
        prefilled = max(length - 1 - first_new, 0)
        if prefilled:
            # The rest of the prefix but its last token goes through the causal path
            # first: under the tree's 4-D mask a long prefix costs far more (a 250-token
            # prompt and 10 nodes: 940 ms in one pass, 815 ms in two; a chain: 760 ms).
            self._evaluate(prefix[: length - 1], first_new, 1)
        start = self._tokens.shape[0]  # first_new, or 0 if the model kept no cache
        m = length - start + n  # this pass's query positions
        ancestors = np.zeros((n, n), dtype=bool)  # node i sees node j
        for i, p in enumerate(par.tolist()):
            if p >= 0:
                ancestors[i] = ancestors[p]
            ancestors[i, i] = True
        allowed = np.zeros((m, start + m), dtype=bool)
        allowed[:, :start] = True  # the cached prefix
        k = length - start  # uncached prefix tokens: causal among themselves
        allowed[:k, start : start + k] = np.tril(np.ones((k, k), dtype=bool))
        allowed[k:, start : start + k] = True
        allowed[k:, start + k :] = ancestors
        positions = np.concatenate([np.arange(start, length), length - 1 + depth])
        ids = np.concatenate([prefix[start:], tokens])
        kept = 0  # the leading chain of nodes 0, 1, ...: its cache entries are in order
        while kept < n and par[kept] == kept - 1:
            kept += 1
        rows = self._evaluate_tree(ids, positions, allowed, start, length + kept, k - 1)
        self._tokens = (
            np.concatenate([prefix, tokens[:kept]])
            if self._cache is not None
            else (self._tokens[:0])
        )
        self.n_forward_calls += 1
        self.n_evaluated_tokens += prefilled + m
        return rows

    def _evaluate_tree(self, ids, positions, allowed, start, keep, first_row) -> np.ndarray:
        """One pass over ``ids`` under the mask ``allowed``; the cache cut to ``keep``."""
        torch = self._torch
        if self._cache is None:
            self._cache = self._new_cache()
        parameter = next(self.model.parameters(), None)
        dtype = parameter.dtype if parameter is not None else torch.float32
        mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype)
        mask[torch.from_numpy(allowed)] = 0.0
        kwargs: dict[str, Any] = {
            "use_cache": True,
            "attention_mask": mask[None, None].to(self.device),
            "position_ids": torch.tensor(positions[None], dtype=torch.long, device=self.device),
        }
        if self._cache is not None:
            kwargs[self._cache_arg] = self._cache
        try:
            with torch.inference_mode():
                out = self.model(
                    torch.tensor(ids[None], dtype=torch.long, device=self.device), **kwargs
                )
                logits = out.logits[0, first_row:]
                rows = logits.to(device="cpu", dtype=torch.float32).numpy().copy()
        except BaseException:
            self._cache = None  # it may hold part of this pass in some layers
            self._tokens = self._tokens[:0]
            raise
        returned = out.get(self._cache_arg) if hasattr(out, "get") else None
        if returned is not None:
            self._cache = returned
        # Entries past the kept branch are other branches' (and not in sequence order).
        if keep < start + len(ids):
            self._cache = self._cropped(self._cache, keep, start + len(ids))
        return rows

    # -- text (with the tokenizer given at creation) ------------------------------

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(
                "this TransformersModel has no tokenizer: create it with "
                "TransformersModel(model, tokenizer=AutoTokenizer.from_pretrained(...))"
            )
        return self.tokenizer

    def tokenize(self, text: str | bytes, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` with the model's tokenizer.

        Parameters
        ----------
        text : str or bytes
            Text to encode (``bytes`` are decoded as UTF-8).
        add_bos : bool, default True
            Whether to add the tokenizer's special tokens (its
            beginning-of-sequence token, for the models that have one).

        Returns
        -------
        list of int

        Raises
        ------
        ValueError
            If the model was created without a tokenizer.
        """
        tokenizer = self._require_tokenizer()
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=add_bos)]

    def detokenize(self, ids: Any) -> str:
        """Text of a sequence of token ids.

        Parameters
        ----------
        ids : iterable of int

        Returns
        -------
        str

        Raises
        ------
        ValueError
            If the model was created without a tokenizer.
        """
        return self._require_tokenizer().decode([int(t) for t in ids])

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token id: the tokenizer's, else the model config's.

        None when neither defines one (generation then runs to its length).
        """
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
            if isinstance(eos, (list, tuple)):  # several stop tokens: the decoder takes one
                eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    def __repr__(self) -> str:
        name = type(self.model).__name__
        return (
            f"TransformersModel({name}, vocab_size={self.vocab_size}, device={str(self.device)!r})"
        )

    # -- chat (the tokenizer's template and its end of turn) -----------------------------

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template, or None (also without a tokenizer)."""
        return getattr(self.tokenizer, "chat_template", None) or None

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """The chat as text, formatted with the tokenizer's own template.

        Parameters
        ----------
        messages : list of dict
            ``{"role": ..., "content": ...}`` messages.
        add_generation_prompt : bool, default True
            End with the header of the assistant's turn.

        Returns
        -------
        str

        Raises
        ------
        ValueError
            If there is no tokenizer or it has no chat template.
        """
        tokenizer = self._require_tokenizer()
        if self.chat_template is None:
            raise ValueError(f"{self!r}: the tokenizer has no chat template")
        return tokenizer.apply_chat_template(
            check_messages(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode_chat(self, messages, special_content: bool = False) -> list[int]:
        """Token ids of the chat, ready for the assistant's reply (see apply_chat_template).

        Only the template's markup becomes special tokens: a message's content is
        plain text (``split_special_tokens``), so text such as ``<|im_end|>`` in a
        message cannot end its turn or forge another
        (:func:`specdec.models._text.encode_chat_ids`).

        Parameters
        ----------
        messages : list of dict
            ``{"role": ..., "content": ...}`` messages.
        special_content : bool, default False
            Parse special tokens written in the content too (the behaviour of
            ``apply_chat_template(tokenize=True)``).

        Returns
        -------
        list of int
        """
        tokenizer = self._require_tokenizer()
        # The template writes the special tokens itself: the tokenizer adds none.
        return encode_chat_ids(
            self.apply_chat_template,
            messages,
            lambda text: self.tokenize(text, add_bos=False),
            lambda text: [
                int(t)
                for t in tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            ],
            special_content,
        )

    def _special_ids(self) -> set:
        """The tokenizer's special tokens and its added tokens (never split in text)."""
        tokenizer = self.tokenizer
        ids = {int(t) for t in getattr(tokenizer, "all_special_ids", ())}
        # Chat markers are often added tokens, not all of them flagged special.
        ids.update(int(t) for t in getattr(tokenizer, "added_tokens_decoder", {}))
        return ids

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end a reply: the template's end of turn (if any), then end of sequence."""
        eot = None
        if self.chat_template is not None:
            eot = end_of_turn_id(
                self.apply_chat_template,
                lambda text: self.tokenize(text, add_bos=False),
                special_ids=self._special_ids(),
            )
        eos = self.eos_token_id
        return list(dict.fromkeys(t for t in (eot, eos) if t is not None))


def _attention_window(config: Any) -> float:
    """The longest sequence whose every token attends to all before it (inf: any).

    A model with sliding-window layers (Mistral, Gemma 2 and 3, ...) attends within
    its window only, which a tree pass's 4-D mask does not express.
    """
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any("sliding" in str(kind) for kind in layer_types)
    window = getattr(config, "sliding_window", None)
    if window is None:
        return 0 if sliding else float("inf")
    if not sliding and getattr(config, "use_sliding_window", True) is False:
        return float("inf")  # Qwen2 and others: a window configured but not used
    return int(window)
