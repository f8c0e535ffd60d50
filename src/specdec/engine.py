"""The engine API: one functional verification step, for one sequence or a batch.

Serving engines do not run a decoder loop: they score the drafts of many sequences
with one target pass and then call one verification kernel over the batch (FlashInfer's
``chain_speculative_sampling``, vLLM's rejection sampler).  :func:`verify` is that
step for one sequence and :func:`verify_batch` for a batch with ragged draft lengths,
run across cores.  Both keep the output law exactly the target's, under the same
temperature, top-k, top-p and min-p as :class:`specdec.SpeculativeDecoder`, and make
the decoder's decisions for the same uniforms.

The draft law q
---------------
``draft_kind="logits"`` (default): ``draft`` holds the draft model's logits, and q
is computed from them under the same controls, by the kernel that computes it when
the decoder samples a draft token (``row_laws``: bit-identical to ``sample_token``'s
law).  ``draft_kind="probs"``: ``draft`` holds probabilities, taken as given and
normalised by their row sums.  ``draft=None``: one-hot drafts (a deterministic
drafter such as prompt lookup): a draft x is kept with probability p(x), and after a
rejection the next token is drawn from p without x, renormalised.

Determinism
-----------
Each sequence draws only from its own generator, in the order of the kernels (see
``specdec._core.verify``): a sequence's result depends on its own rows, drafts and
generator only, never on the rest of the batch, its position in it or the number
of threads (vLLM #13196).  A generator must therefore not be shared by two sequences
of one call (refused).

Threads
-------
The compiled kernels release the GIL while they read the rows, so the sequences of a
batch run in parallel on a thread pool kept by this module (created on first use,
grown if a call asks for more threads, up to the number of cores; never per call).
Each thread claims sequences from a shared counter and verifies them in one stretch
without the GIL (logits or one-hot drafts; with probabilities a sequence's checks run
in NumPy).  The calling thread works too; each thread keeps its own kernel ``Workspace`` and
draft buffers, sized for the vocabulary and reused across calls.  The pure-Python
backend runs on the same threads (without speed-up: NumPy's passes are short and the
GIL is held between them).

Inputs
------
float32 and float64 arrays are read in place; so is anything NumPy can view without
a copy (``np.from_dlpack``: CPU torch tensors and other DLPack producers, or the
buffer/array protocols).  The kernels read C-contiguous rows: an array whose rows
are not (a transposed or strided view) is copied once per call.  Padding (draft ids
and rows beyond a sequence's length) is never read and may hold anything.  Nothing
is ever written to the caller's arrays; read-only arrays are accepted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specdec._engine_inputs import check_n_threads, validate
from specdec._engine_run import default_threads, run, verify_one

__all__ = ["BatchResult", "verify", "verify_batch"]


class BatchResult(NamedTuple):
    """What :func:`verify_batch` returns (a tuple: ``n, nxt, tokens = verify_batch(...)``).

    Attributes
    ----------
    n_accepted : ndarray of int64, shape (B,)
        Drafts kept by each sequence (a prefix of its drafts).
    next_tokens : ndarray of int64, shape (B,)
        Each sequence's next token: the residual draw after a rejection, else the bonus.
    tokens : ndarray of int64, shape (B, K + 1)
        The tokens each sequence emits, ``n_accepted[b] + 1`` of them (the kept drafts,
        then the next token), padded with -1.
    """

    n_accepted: np.ndarray
    next_tokens: np.ndarray
    tokens: np.ndarray


def verify(
    draft_token_ids,
    draft,
    target_logits,
    *,
    draft_kind="logits",
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    verification="block",
    rng=None,
    backend=None,
):
    """Verify one sequence's k drafted tokens against the target's k + 1 rows.

    Parameters
    ----------
    draft_token_ids : array-like of int, shape (k,)
        The drafted tokens, k >= 0 (ids in [0, V)).
    draft : array of float32 or float64, shape (k, V), or None
        The draft's rows: logits (``draft_kind="logits"``; q is their law under the
        sampling controls, as the decoder computes it when it samples a draft), or
        probabilities (``draft_kind="probs"``; finite, >= 0, normalised by their row
        sums, with positive mass on each row and on the drafted token); None for
        one-hot drafts (a deterministic drafter).  Row i is the law ``draft_token_ids[i]``
        was drawn from: a drafted token of draft probability 0 is refused (except at
        temperature 0, where drafts are judged against the target's argmax alone; the
        draft rows are still checked).
    target_logits : array of float32 or float64, shape (k + 1, V)
        The target's logits: row i predicts draft i, row k the token after the drafts.
    draft_kind : {"logits", "probs"}, default "logits"
        What ``draft`` holds (ignored when it is None).
    temperature, top_k, top_p, min_p
        Sampling controls of both models, as for :class:`specdec.SpeculativeDecoder`;
        temperature 0 is greedy (a draft is kept iff it is the target's argmax; no
        uniform is drawn).
    verification : {"block", "token"}, default "block"
        Block verification (Sun et al., ICLR 2025) or token by token (Leviathan et al.
        2023); both exact.
    rng : numpy.random.Generator or int, optional
        The uniforms' source; an int seeds a new generator; default: a seed drawn from
        NumPy's global state (as :func:`specdec.sample` does).
    backend : {"cython", "python"}, optional
        Kernel backend; default :data:`specdec.BACKEND`.

    Returns
    -------
    n_accepted : int
        Drafts kept (a prefix of ``draft_token_ids``).
    next_token : int
        The token after them: a draw from the residual after a rejection, else the
        bonus token from row k.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named (checked before anything is drawn), or rows that define
        no law: target or draft logits with NaN or +inf, or all -inf, in a row the
        decision reads (every draft row, the target rows up to the decision), bad draft
        probabilities, or a drafted token of draft probability 0 (it cannot have been
        drawn from q).  Such row errors may come after uniforms were drawn.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec.engine import verify
    >>> rng = np.random.default_rng(0)
    >>> target = rng.standard_normal((3, 10))
    >>> n_accepted, token = verify([4, 7], rng.standard_normal((2, 10)), target, rng=rng)
    """
    step = validate(
        draft_token_ids,
        draft,
        target_logits,
        lengths=None,
        draft_kind=draft_kind,
        controls=(temperature, top_k, top_p, min_p),
        verification=verification,
        rngs=rng,
        backend=backend,
        single=True,
    )
    n_accepted, token = verify_one(step, 0)
    return int(n_accepted), int(token)


def verify_batch(
    draft_token_ids,
    draft,
    target_logits,
    lengths,
    *,
    draft_kind="logits",
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    verification="block",
    rngs=None,
    n_threads=None,
    backend=None,
) -> BatchResult:
    """Verify a batch of sequences with ragged draft lengths, in parallel.

    Sequence b is verified exactly as ``verify(draft_token_ids[b, :n], draft[b, :n],
    target_logits[b, :n + 1], rng=rngs[b], ...)`` with ``n = lengths[b]`` would be,
    whatever the rest of the batch, its position in it or the number of threads.

    Parameters
    ----------
    draft_token_ids : array-like of int, shape (B, K)
        Drafted tokens, padded: only ``draft_token_ids[b, :lengths[b]]`` is read.
    draft : array of float32 or float64, shape (B, K, V), or None
        Draft rows (logits or probabilities, see ``draft_kind``), padded like the ids;
        None for one-hot drafts.
    target_logits : array of float32 or float64, shape (B, K + 1, V)
        Target rows: ``target_logits[b, :lengths[b] + 1]`` is read, as far as the
        decision needs.
    lengths : array-like of int, shape (B,)
        Each sequence's number of drafts, in [0, K] (0: only the next token is drawn).
    draft_kind, temperature, top_k, top_p, min_p, verification, backend
        As for :func:`verify`.
    rngs : sequence of numpy.random.Generator or int, length B
        One generator (or seed) per sequence, each with its own bit generator; may be
        None only for greedy decoding (temperature 0), which draws nothing.
    n_threads : int, optional
        Threads to run on, the calling one included; 1 runs inline.  A larger number
        is capped at ``os.cpu_count()``: the kernels are CPU-bound, so more threads
        than cores only wait on one another (and the module's pool, whose threads
        outlive the call, stays at most that large).  Default: every core when the
        batch reads at least 524,288 logits (drafts' and target's rows; with
        ``draft_kind="probs"`` or the pure-Python backend, 65,536 a sequence on
        average, as a sequence's Python then takes turns at the GIL), else 1: below
        that the hand-off to another thread outweighs what it saves.

    Returns
    -------
    BatchResult
        ``(n_accepted, next_tokens, tokens)``: int64 arrays of shapes (B,), (B,) and
        (B, K + 1); ``tokens[b]`` holds the kept drafts, the next token, then -1s.

    Raises
    ------
    TypeError, ValueError
        As for :func:`verify`; argument errors come before any work.  A row error names
        the lowest failing sequence; every other sequence is still verified (so each
        generator advances as its own call would), and the results are discarded.
    """
    threads = check_n_threads(n_threads)
    step = validate(
        draft_token_ids,
        draft,
        target_logits,
        lengths=lengths,
        draft_kind=draft_kind,
        controls=(temperature, top_k, top_p, min_p),
        verification=verification,
        rngs=rngs,
        backend=backend,
        single=False,
    )
    if threads is None:
        threads = default_threads(step)
    n_accepted, next_tokens, tokens = run(step, threads)
    return BatchResult(n_accepted, next_tokens, tokens)
