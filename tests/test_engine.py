"""The engine API (issue 12): ``specdec.engine.verify`` and ``verify_batch``.

* **A batch is its sequences**: each sequence of a random ragged batch (logits,
  probabilities and one-hot drafts, both schemes, with and without controls) gets
  the result, and leaves its generator in the state, of verifying it alone; a
  reversed batch and other thread counts change nothing.
* **The decoder's own step**: ``SpeculativeDecoder.generate`` on toy models, with a
  spy around the backend's kernels that records every draft row sampled, every
  verify call's target rows and drafts, and the generator's state before it;
  ``verify`` with those draft logits, target logits and a generator restored to
  that state returns the kernel's (n_accepted, token).
* **The exact law**: for fixed rows (V = 4, k = 3) that do not depend on the
  context, the emitted tokens completed by independent target draws up to k + 1
  tokens must follow prod_j p_j exactly (lossless speculative sampling, for either
  scheme); compared by the pooled chi-square of ``law_models`` at fixed seeds.  The
  same statistic rejects a sampler that keeps every draft (power).
* **Inputs**: float32/float64, CPU torch tensors through DLPack, read-only and
  strided arrays, caller arrays bit-identical after every call; and every bad
  input fails before any work with an error naming the argument.

False alarms: each chi-square test is seeded and deterministic; a change in the
stream of uniforms re-draws it, and then it fails by chance with probability ALPHA.
"""

from __future__ import annotations

import copy
import inspect
import os

import numpy as np
import pytest
from conftest import PURE_PYTHON
from law_models import ContextModel, pooled_chisquare, same_state, warped_probs

import specdec
from specdec import _engine_run, engine
from specdec._verifier import Verifier
from specdec.engine import verify, verify_batch

ALPHA = 1e-3
POWER_ALPHA = 1e-6

SCHEMES = ("block", "token")
KINDS = ("logits", "probs", "one-hot")
CONTROLS = {
    "plain": {},
    "warm-topk": {"temperature": 0.8, "top_k": 3},
    "topp-minp": {"temperature": 1.3, "top_p": 0.8, "min_p": 0.05},
}


# --- helpers ------------------------------------------------------------------------------


def _draft_rows(kind, logits, controls):
    """The draft argument for ``kind`` built from draft logits (None for one-hot)."""
    if kind == "one-hot":
        return None
    if kind == "logits":
        return logits
    # probabilities that are not normalised (the engine divides by the row sums)
    with np.errstate(invalid="ignore"):  # padding rows of NaN stay NaN
        probs = np.stack(
            [warped_probs(row, **controls) for row in logits.reshape(-1, logits.shape[-1])]
        )
    return (3.0 * probs).reshape(logits.shape).astype(logits.dtype)


def _draw_drafts(rng, logits, controls, kind):
    """Draft tokens drawn from each row's warped law (any ids for one-hot drafts)."""
    if kind == "one-hot":
        return rng.integers(0, logits.shape[-1], size=logits.shape[:-1])
    flat = logits.reshape(-1, logits.shape[-1])
    ids = [rng.choice(flat.shape[1], p=warped_probs(row, **controls)) for row in flat]
    return np.asarray(ids, dtype=np.int64).reshape(logits.shape[:-1])


def _random_batch(
    seed,
    batch=7,
    width=5,
    vocab=40,
    kind="logits",
    controls=None,
    dtype=np.float64,
    draft_dtype=None,
):
    rng = np.random.default_rng(seed)
    controls = controls or {}
    target = (1.5 * rng.standard_normal((batch, width + 1, vocab))).astype(dtype)
    draft_logits = (target[:, :width] + rng.standard_normal((batch, width, vocab))).astype(
        draft_dtype or dtype
    )
    ids = _draw_drafts(rng, draft_logits, controls, kind)
    lengths = rng.integers(0, width + 1, size=batch)
    lengths[0], lengths[-1] = 0, width  # always one empty and one full draft
    # padding holds garbage the engine must not read
    for b, n in enumerate(lengths):
        ids[b, n:] = -7
        target[b, n + 1 :] = np.nan
        draft_logits[b, n:] = np.nan
    return ids, _draft_rows(kind, draft_logits, controls), target, lengths


def _seeds(batch, base=100):
    return [np.random.default_rng(base + b) for b in range(batch)]


# --- a batch is its sequences -------------------------------------------------------------


@pytest.mark.parametrize("controls", list(CONTROLS), ids=list(CONTROLS))
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", KINDS)
def test_each_sequence_of_a_batch_equals_verifying_it_alone(backend, kind, scheme, controls):
    options = dict(CONTROLS[controls], verification=scheme, backend=backend)
    draft_kind = "probs" if kind == "probs" else "logits"
    for seed in range(3):
        ids, draft, target, lengths = _random_batch(seed, kind=kind, controls=CONTROLS[controls])
        rngs = _seeds(len(ids))
        result = verify_batch(
            ids, draft, target, lengths, draft_kind=draft_kind, rngs=rngs, **options
        )
        alone_rngs = _seeds(len(ids))
        for b, n in enumerate(lengths):
            alone = verify(
                ids[b, :n],
                None if draft is None else draft[b, :n],
                target[b, : n + 1],
                draft_kind=draft_kind,
                rng=alone_rngs[b],
                **options,
            )
            assert (result.n_accepted[b], result.next_tokens[b]) == alone
            assert same_state(rngs[b].bit_generator.state, alone_rngs[b].bit_generator.state)
            emitted = list(ids[b, : alone[0]]) + [alone[1]]
            assert result.tokens[b].tolist() == emitted + [-1] * (ids.shape[1] - alone[0])
        # nor on its position: the reversed batch gives the reversed results
        flipped = verify_batch(
            ids[::-1],
            None if draft is None else draft[::-1],
            target[::-1],
            lengths[::-1],
            draft_kind=draft_kind,
            rngs=_seeds(len(ids))[::-1],
            **options,
        )
        assert np.array_equal(flipped.tokens, result.tokens[::-1])
        assert (
            result.n_accepted.dtype == result.next_tokens.dtype == result.tokens.dtype == np.int64
        )


def test_results_are_not_constant(backend):
    # the equality tests above would pass on a constant function: the batch varies
    ids, draft, target, lengths = _random_batch(3, batch=40)
    result = verify_batch(ids, draft, target, lengths, rngs=_seeds(40), backend=backend)
    assert len(set(result.next_tokens.tolist())) > 5
    assert len(set(result.n_accepted.tolist())) > 2


@pytest.mark.parametrize("scheme", SCHEMES)
def test_thread_counts_give_identical_results(backend, scheme):
    ids, draft, target, lengths = _random_batch(11, batch=33, vocab=700)  # two blocks
    runs = []
    for n_threads in (1, 2, 3, None):
        rngs = _seeds(len(ids))
        result = verify_batch(
            ids,
            draft,
            target,
            lengths,
            rngs=rngs,
            n_threads=n_threads,
            verification=scheme,
            backend=backend,
        )
        runs.append((result, [g.bit_generator.state for g in rngs]))
    for result, states in runs[1:]:
        for got, expected in zip(result, runs[0][0], strict=False):
            assert np.array_equal(got, expected)
        assert all(same_state(a, b) for a, b in zip(states, runs[0][1], strict=False))


def test_the_thread_pool_is_reused_and_grown_on_demand(backend):
    ids, draft, target, lengths = _random_batch(1, batch=8)
    verify_batch(ids, draft, target, lengths, rngs=_seeds(8), n_threads=2, backend=backend)
    pool = _engine_run._pool
    assert pool is not None
    verify_batch(ids, draft, target, lengths, rngs=_seeds(8), n_threads=2, backend=backend)
    assert _engine_run._pool is pool  # not one pool per call
    many = verify_batch(ids, draft, target, lengths, rngs=_seeds(8), n_threads=6, backend=backend)
    assert _engine_run._pool_size >= min(5, (os.cpu_count() or 1) - 1)  # capped at the cores
    one = verify_batch(ids, draft, target, lengths, rngs=_seeds(8), n_threads=1, backend=backend)
    assert np.array_equal(many.tokens, one.tokens)


def test_calls_from_several_threads_at_once_equal_the_same_calls_in_turn(backend):
    """The module's pool is shared: calls made at the same time (each on 2 threads) give
    what they give one after another, and two calls that share generators, listed in
    opposite orders, both finish (the generators' locks are taken in one order)."""
    import threading

    batches = [_random_batch(60 + i, batch=6, vocab=300) for i in range(4)]
    alone = [
        verify_batch(*batch, rngs=_seeds(6, base=10 * i), n_threads=2, backend=backend)
        for i, batch in enumerate(batches)
    ]
    together: dict = {}

    def call(i):
        together[i] = verify_batch(
            *batches[i], rngs=_seeds(6, base=10 * i), n_threads=2, backend=backend
        )

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(np.array_equal(together[i].tokens, alone[i].tokens) for i in range(4))

    shared = _seeds(6)
    orders = [shared, shared[::-1]]
    done = []

    def call_shared(order):
        for _ in range(20):
            verify_batch(*batches[0], rngs=order, n_threads=2, backend=backend)
        done.append(True)

    threads = [threading.Thread(target=call_shared, args=(order,), daemon=True) for order in orders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert done == [True, True]


def test_the_default_uses_threads_only_where_they_pay(backend, monkeypatch):
    """n_threads=None: one thread for batches of few logits (the hand-offs, and a
    sequence's Python where the GIL serialises it, outweigh their kernels), every core
    for large ones; a number given is used as given."""
    used = []
    real_run = engine.run

    def recording_run(step, threads, *outputs):
        used.append(threads)
        return real_run(step, threads, *outputs)

    monkeypatch.setattr(engine, "run", recording_run)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    rows_per_sequence = 2 * 4 + 1  # 4 drafted rows of logits and 5 target rows
    if backend == "cython":  # the compiled batch kernel: the whole batch's logits count
        threshold_vocab = -(-_engine_run.MIN_THREADED_BATCH_LOGITS // (2 * rows_per_sequence))
    else:  # a sequence at a time: its own logits count
        threshold_vocab = -(-_engine_run.MIN_THREADED_LOGITS // rows_per_sequence)
    rng = np.random.default_rng(5)
    for vocab in (40, threshold_vocab - 1, threshold_vocab):
        target = rng.standard_normal((2, 5, vocab))
        draft = target[:, :4] + rng.standard_normal((2, 4, vocab))
        ids = rng.integers(0, vocab, size=(2, 4))
        for n_threads in (None, 2):
            verify_batch(
                ids, draft, target, [4, 4], rngs=_seeds(2), n_threads=n_threads, backend=backend
            )
    assert used == [1, 2, 1, 2, 2, 2]


def test_int_seeds_equal_generators(backend):
    ids, draft, target, lengths = _random_batch(5)
    seeds = list(range(100, 100 + len(ids)))
    by_seed = verify_batch(ids, draft, target, lengths, rngs=seeds, backend=backend)
    by_generator = verify_batch(ids, draft, target, lengths, rngs=_seeds(len(ids)), backend=backend)
    assert np.array_equal(by_seed.tokens, by_generator.tokens)
    assert verify(ids[-1], draft[-1], target[-1], rng=7, backend=backend) == verify(
        ids[-1], draft[-1], target[-1], rng=np.random.default_rng(7), backend=backend
    )


def test_empty_drafts_and_empty_batch(backend):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((4, 1, 9))
    result = verify_batch(
        np.zeros((4, 0), np.int64), None, target, [0] * 4, rngs=_seeds(4), backend=backend
    )
    # no drafts given as empty draft rows (a view of 0 rows has strides of 0)
    for empty_rows in (np.zeros((4, 0, 9)), rng.standard_normal((4, 3, 9))[:, :0]):
        same = verify_batch(
            np.zeros((4, 0), np.int64), empty_rows, target, [0] * 4, rngs=_seeds(4),
            backend=backend,
        )  # fmt: skip
        assert all(np.array_equal(x, y) for x, y in zip(same, result, strict=True))
    assert result.n_accepted.tolist() == [0] * 4
    assert result.tokens.shape == (4, 1) and np.array_equal(result.tokens[:, 0], result.next_tokens)
    for b in range(4):
        assert verify([], None, target[b], rng=_seeds(4)[b], backend=backend) == (
            0,
            result.next_tokens[b],
        )
    empty = verify_batch(
        np.zeros((0, 3), np.int64), None, np.zeros((0, 4, 9)), [], rngs=[], backend=backend
    )
    assert [a.shape for a in empty] == [(0,), (0,), (0, 4)]


def test_greedy_needs_no_generator_and_is_the_argmax(backend):
    ids, draft, target, lengths = _random_batch(2, batch=12, vocab=8)
    best = np.argmax(np.nan_to_num(target, nan=-np.inf), axis=2)
    ids = np.where(np.arange(ids.shape[1]) < lengths[:, None], best[:, :-1], ids)
    ids[3, 1] = (ids[3, 1] + 1) % 8  # one wrong draft
    for kind, rows in (("logits", draft), ("one-hot", None)):
        result = verify_batch(
            ids, rows, target, lengths, temperature=0.0, rngs=None, backend=backend
        )
        for b, n in enumerate(lengths):
            kept = n if b != 3 or n < 2 else 1
            assert result.n_accepted[b] == kept, kind
            assert result.next_tokens[b] == best[b, kept]


# --- the decoder's own step ---------------------------------------------------------------


class _Recorder:
    """Wraps a kernel module: records the draft rows ``sample_token`` was given and, per
    ``verify`` call, its target rows, drafts, result and the rng state before it."""

    def __init__(self, kernels):
        self.kernels = kernels
        self.Workspace = kernels.Workspace
        self.rows, self.calls = [], []

    def row_laws(self, *args):
        return self.kernels.row_laws(*args)

    def sample_token(self, *args):
        bound = inspect.signature(self.kernels.sample_token).bind(*args).arguments
        self.rows.append(np.array(bound["logits"]))
        return self.kernels.sample_token(*args)

    def verify(self, *args):
        bound = inspect.signature(self.kernels.verify).bind(*args).arguments
        n = len(bound["draft_tokens"])
        state = copy.deepcopy(bound["rng"].bit_generator.state)
        result = self.kernels.verify(*args)
        self.calls.append(
            (
                np.array(bound["target_rows"]),
                np.array(bound["draft_tokens"]),
                np.array(self.rows[-n:]),
                state,
                type(bound["rng"].bit_generator),
                result,
            )
        )
        return result


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    "controls",
    [{}, {"temperature": 0.7, "top_k": 4}, {"top_p": 0.85, "min_p": 0.1}, {"temperature": 0.0}],
    ids=["plain", "topk", "topp-minp", "greedy"],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_verify_equals_the_decoders_step(backend, scheme, controls, dtype):
    decoder = specdec.SpeculativeDecoder(4, verification=scheme, backend=backend, **controls)
    decoder._verifier = verifier = Verifier(backend)  # its own: the shared one stays clean
    verifier.kernels = spy = _Recorder(verifier.kernels)
    draft = ContextModel(6, seed=3, dtype=dtype, scale=1.0)
    target = ContextModel(6, seed=4, dtype=dtype)
    decoder.generate(draft, target, [1, 2], 60, rng=5)
    assert len(spy.calls) > 10
    outcomes = set()
    for rows, drafted, draft_rows, state, bit_type, (n_accepted, token) in spy.calls:
        rng = np.random.Generator(bit_type())
        rng.bit_generator.state = state
        got = verify(
            drafted, draft_rows, rows, verification=scheme, rng=rng, backend=backend, **controls
        )
        assert got[0] == n_accepted
        if token >= 0:  # the decoder's last step may not ask for a bonus token
            assert got[1] == token
        outcomes.add(n_accepted)
    assert len(outcomes) > 1  # both kept and rejected drafts were compared


# --- the exact law ------------------------------------------------------------------------

VOCAB, K, N_RUNS = 4, 3, 4_000


def _law_rows(dtype=np.float64):
    rng = np.random.default_rng(2024)
    target = 1.2 * rng.standard_normal((K + 1, VOCAB))
    draft = target[:K] + 1.5 * rng.standard_normal((K, VOCAB))
    return target.astype(dtype), draft.astype(dtype)


def _completed_law(target, controls):
    """Exact law of K + 1 tokens drawn independently from the target's warped rows."""
    probs = [warped_probs(row, **controls) for row in target]
    law = {}
    for cell in np.ndindex(*(VOCAB,) * (K + 1)):
        law[cell] = float(np.prod([probs[j][t] for j, t in enumerate(cell)]))
    return law, probs


def _inverse_cdf(rng, probs, n):
    """n independent draws from ``probs`` (vectorised inverse CDF)."""
    cdf = np.cumsum(probs)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n), side="right"), len(probs) - 1)


def _sample_completed(step, target, draft, kind, controls, seed):
    """Outcomes of ``step`` (emitted tokens), completed by target draws to K + 1 tokens."""
    rng = np.random.default_rng(seed)
    others = np.random.default_rng(seed + 1)
    probs = [warped_probs(row, **controls) for row in target]
    # independent of the step: drafts from each draft row's law (a fixed proposal for
    # one-hot drafts) and, per position, a target draw used when the step stops short
    if kind == "one-hot":
        drafts = np.tile([2, 0, 3], (N_RUNS, 1))
    else:
        drafts = np.stack(
            [_inverse_cdf(others, warped_probs(row, **controls), N_RUNS) for row in draft], axis=1
        )
    completions = np.stack([_inverse_cdf(others, p, N_RUNS) for p in probs], axis=1)
    rows = _draft_rows(kind, draft, controls)
    outcomes = []
    for ids, completion in zip(drafts, completions, strict=False):
        emitted = step(ids, rows, rng)
        outcomes.append(tuple(emitted) + tuple(completion[len(emitted) :].tolist()))
    return outcomes


@pytest.mark.parametrize("controls", ["plain", "warm-topk"])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", KINDS)
def test_exact_law_through_verify(backend, kind, scheme, controls):
    controls = CONTROLS[controls]
    target, draft = _law_rows()
    draft_kind = "probs" if kind == "probs" else "logits"

    def step(ids, rows, rng):
        n, token = verify(
            ids,
            rows,
            target,
            draft_kind=draft_kind,
            verification=scheme,
            rng=rng,
            backend=backend,
            **controls,
        )
        return [int(t) for t in ids[:n]] + [token]

    outcomes = _sample_completed(step, target, draft, kind, controls, seed=7)
    law, _ = _completed_law(target, controls)
    result = pooled_chisquare(outcomes, law)
    assert result.impossible == 0, result
    assert result.pvalue > ALPHA, result


def test_the_statistic_rejects_a_sampler_that_keeps_every_draft():
    target, draft = _law_rows()
    probs = [warped_probs(row) for row in target]

    def keep_everything(ids, rows, rng):
        return [int(t) for t in ids] + [int(rng.choice(VOCAB, p=probs[K]))]

    outcomes = _sample_completed(keep_everything, target, draft, "logits", {}, seed=7)
    law, _ = _completed_law(target, {})
    assert pooled_chisquare(outcomes, law).pvalue < POWER_ALPHA


# --- inputs: dtypes, DLPack, layouts, no writes -------------------------------------------


def _frozen(*arrays):
    return [None if a is None else a.copy() for a in arrays]


def _assert_untouched(before, after):
    for a, b in zip(before, after, strict=False):
        if a is not None:
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.float32),
        (np.float64, np.float64),
        (np.float32, np.float64),
        (np.float64, np.float32),
    ],
)
def test_dtypes_read_only_and_no_writes(backend, kind, dtypes):
    ids, draft, target, lengths = _random_batch(
        9, kind=kind, dtype=dtypes[0], draft_dtype=dtypes[1]
    )
    draft_kind = "probs" if kind == "probs" else "logits"
    before = _frozen(ids, draft, target, lengths)
    expected = verify_batch(
        ids, draft, target, lengths, draft_kind=draft_kind, rngs=_seeds(len(ids)), backend=backend
    )
    _assert_untouched(before, [ids, draft, target, lengths])
    for array in (ids, draft, target, lengths):
        if array is not None:
            array.flags.writeable = False
    again = verify_batch(
        ids, draft, target, lengths, draft_kind=draft_kind, rngs=_seeds(len(ids)), backend=backend
    )
    assert np.array_equal(again.tokens, expected.tokens)
    _assert_untouched(before, [ids, draft, target, lengths])
    b = int(np.argmax(lengths))
    n = lengths[b]
    single = verify(
        ids[b, :n],
        None if draft is None else draft[b, :n],
        target[b, : n + 1],
        draft_kind=draft_kind,
        rng=_seeds(len(ids))[b],
        backend=backend,
    )
    assert single == (expected.n_accepted[b], expected.next_tokens[b])
    _assert_untouched(before, [ids, draft, target, lengths])


def test_strided_inputs_are_read_right(backend):
    ids, draft, target, lengths = _random_batch(4, batch=6)
    expected = verify_batch(ids, draft, target, lengths, rngs=_seeds(6), backend=backend)
    # rows that are not C-contiguous (copied once), and a batch axis of any stride
    t_strided = np.asfortranarray(target)
    d_strided = np.asfortranarray(draft)
    got = verify_batch(ids, d_strided, t_strided, lengths, rngs=_seeds(6), backend=backend)
    assert np.array_equal(got.tokens, expected.tokens)
    wide = np.stack([target, target], axis=1)[:, 0]  # batch stride twice the block
    got = verify_batch(ids, draft, wide, lengths, rngs=_seeds(6), backend=backend)
    assert np.array_equal(got.tokens, expected.tokens)
    # one row shared by the batch through a zero stride
    shared = np.broadcast_to(target[-1], target.shape)
    same = verify_batch(
        np.broadcast_to(ids[-1], ids.shape),
        np.broadcast_to(draft[-1], draft.shape),
        shared,
        [lengths[-1]] * 6,
        rngs=list(range(6)),
        backend=backend,
    )
    alone = [verify(ids[-1], draft[-1], target[-1], rng=b, backend=backend) for b in range(6)]
    assert list(zip(same.n_accepted, same.next_tokens, strict=False)) == alone
    # other integer types for ids and lengths
    got = verify_batch(
        ids.astype(np.int32),
        draft,
        target,
        lengths.astype(np.uint8),
        rngs=_seeds(6),
        backend=backend,
    )
    assert np.array_equal(got.tokens, expected.tokens)
    # non-native byte order
    got = verify_batch(
        ids,
        draft,
        target.astype(target.dtype.newbyteorder(">")),
        lengths,
        rngs=_seeds(6),
        backend=backend,
    )
    assert np.array_equal(got.tokens, expected.tokens)

    # unaligned rows (a buffer at an odd offset), which the compiled batch path leaves
    # to the per-sequence one
    def unaligned(a):
        raw = np.zeros(a.nbytes + 1, np.uint8)
        view = np.frombuffer(raw.data, a.dtype, a.size, offset=1).reshape(a.shape)
        view[...] = a
        assert not view.flags.aligned
        return view

    got = verify_batch(
        ids, unaligned(draft), unaligned(target), lengths, rngs=_seeds(6), backend=backend
    )
    assert np.array_equal(got.tokens, expected.tokens)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_tensors_through_dlpack(backend, dtype):
    torch = pytest.importorskip("torch")
    ids, draft, target, lengths = _random_batch(6, dtype=np.dtype(dtype))
    ids = ids.copy()
    ids[ids < 0] = 0  # padding of valid ids
    target, draft = np.nan_to_num(target), np.nan_to_num(draft)
    expected = verify_batch(ids, draft, target, lengths, rngs=_seeds(len(ids)), backend=backend)
    tensors = [torch.from_numpy(a.copy()) for a in (ids, draft, target, lengths)]
    before = [t.clone() for t in tensors]
    got = verify_batch(*tensors, rngs=_seeds(len(ids)), backend=backend)
    assert np.array_equal(got.tokens, expected.tokens)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=False))
    # a view, not a copy: np.from_dlpack shares the tensor's memory
    assert np.shares_memory(np.from_dlpack(tensors[2]), tensors[2].numpy())
    n = int(lengths[-1])
    single = verify(
        tensors[0][-1, :n],
        tensors[1][-1, :n],
        tensors[2][-1, : n + 1],
        rng=_seeds(len(ids))[-1],
        backend=backend,
    )
    assert single == (expected.n_accepted[-1], expected.next_tokens[-1])
    with pytest.raises(TypeError, match="target_logits"):
        verify_batch(
            ids,
            draft,
            torch.from_numpy(target).requires_grad_(),
            lengths,
            rngs=_seeds(len(ids)),
            backend=backend,
        )


# --- errors in the rows -------------------------------------------------------------------


def test_invalid_rows_name_the_argument_sequence_and_row(backend):
    ids, draft, target, lengths = _random_batch(8, batch=5, vocab=12)
    lengths[:] = 3
    ids[:, :3] = np.argmax(draft[:, :3], axis=2)
    draft[:, :3] = np.nan_to_num(draft[:, :3])
    target[:, :4] = np.nan_to_num(target[:, :4])
    bad = target.copy()
    bad[2, 0] = np.nan
    bad[4, 0, 3] = np.inf
    with pytest.raises(
        ValueError,
        match=r"target_logits\[2, 0\] \(sequence 2, row 0\) holds "
        r"NaN or \+inf",
    ):
        verify_batch(ids, draft, bad, lengths, rngs=_seeds(5), n_threads=2, backend=backend)
    masked = target.copy()
    masked[1, 0] = -np.inf
    with pytest.raises(ValueError, match=r"target_logits\[1, 0\].*all -inf"):
        verify_batch(ids, draft, masked, lengths, rngs=_seeds(5), backend=backend)
    with pytest.raises(ValueError, match=r"^target_logits\[0\] holds NaN"):
        verify(ids[2, :3], draft[2, :3], bad[2, :4], rng=0, backend=backend)
    bad_draft = draft.copy()
    bad_draft[3, 2, 5] = np.nan
    with pytest.raises(ValueError, match=r"draft\[3, 2\] \(sequence 3, row 2\) holds NaN"):
        verify_batch(ids, bad_draft, target, lengths, rngs=_seeds(5), backend=backend)
    # a draft the draft's law could not have produced (outside its top-k)
    worst = ids.copy()
    worst[1, 1] = np.argmin(draft[1, 1])
    with pytest.raises(ValueError, match=r"draft_token_ids\[1, 1\].*probability 0"):
        verify_batch(worst, draft, target, lengths, top_k=2, rngs=_seeds(5), backend=backend)


def test_rows_the_decision_does_not_read_may_hold_anything(backend):
    # greedy: the first draft is wrong, so rows 1.. are never read
    target = np.full((3, 5), np.nan)
    target[0] = [0.0, 3.0, 1.0, 0.0, 0.0]
    assert verify([2, 2], None, target, temperature=0.0, backend=backend) == (0, 1)
    # sampling, token scheme: a draft of target probability 0 is rejected at row 0
    target[0] = [0.0, 3.0, 1.0, 0.0, -np.inf]
    n, token = verify([4, 2], None, target, verification="token", rng=0, backend=backend)
    assert n == 0 and token in (0, 1, 2, 3)


def test_a_row_error_leaves_every_other_generator_as_its_own_call_would(backend):
    ids, draft, target, lengths = _random_batch(12, batch=6)
    bad = target.copy()
    bad[1, 0] = np.nan
    rngs = _seeds(6)
    with pytest.raises(ValueError, match=r"target_logits\[1, 0\]"):
        verify_batch(ids, draft, bad, lengths, rngs=rngs, n_threads=2, backend=backend)
    alone = _seeds(6)
    for b, n in enumerate(lengths):
        if b != 1:
            verify(ids[b, :n], draft[b, :n], target[b, : n + 1], rng=alone[b], backend=backend)
            assert same_state(rngs[b].bit_generator.state, alone[b].bit_generator.state)


def test_a_batch_error_names_its_lowest_failing_sequence(backend):
    ids, draft, target, lengths = _random_batch(12, batch=6)
    bad = target.copy()
    bad[4, 0] = np.nan  # verified later in the batch, on either thread
    bad[2, 0] = np.nan
    for threads in (1, 2):
        with pytest.raises(ValueError, match=r"target_logits\[2, 0\]"):
            verify_batch(
                ids, draft, bad, lengths, rngs=_seeds(6), n_threads=threads, backend=backend
            )


def _probs_batch(seed, batch, width=3, vocab=10):
    rng = np.random.default_rng(seed)
    draft = rng.random((batch, width, vocab)) + 0.1
    ids = rng.integers(0, vocab, (batch, width))
    return ids, draft, rng.standard_normal((batch, width + 1, vocab)), np.full(batch, width)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d.__setitem__((2, 1, 0), -0.1), r"draft\[2, 1\] .*NaN, inf or a negative"),
        (lambda d: d.__setitem__((2, 1, 0), np.inf), r"draft\[2, 1\] .*NaN, inf or a negative"),
        (lambda d: d.__setitem__((2, 1, 0), np.nan), r"draft\[2, 1\] .*NaN, inf or a negative"),
        (lambda d: d.__setitem__((2, 1), 0.0), r"draft\[2, 1\] .*no positive mass"),
    ],
)
def test_bad_draft_probabilities(backend, change, match):
    ids, draft, target, lengths = _probs_batch(13, batch=4)
    change(draft)
    rngs = _seeds(4)
    states = [copy.deepcopy(g.bit_generator.state) for g in rngs]
    with pytest.raises(ValueError, match=match):
        verify_batch(
            ids, draft, target, lengths, draft_kind="probs", rngs=rngs, n_threads=1, backend=backend
        )
    assert same_state(rngs[2].bit_generator.state, states[2])  # found before drawing


def test_drafted_token_of_probability_zero_is_refused(backend):
    ids, draft, target, lengths = _probs_batch(14, batch=3)
    draft[1, 1, ids[1, 1]] = 0.0
    with pytest.raises(
        ValueError,
        match=r"draft_token_ids\[1, 1\] \(sequence 1, row 1\): "
        r"token \d+ has probability 0",
    ):
        verify_batch(
            ids, draft, target, lengths, draft_kind="probs", rngs=_seeds(3), backend=backend
        )


# --- bad arguments ------------------------------------------------------------------------


def _good():
    rng = np.random.default_rng(0)
    return {
        "draft_token_ids": np.zeros((2, 3), np.int64),
        "draft": rng.standard_normal((2, 3, 8)),
        "target_logits": rng.standard_normal((2, 4, 8)),
        "lengths": np.array([3, 1]),
        "rngs": [np.random.default_rng(1), 2],
    }


BAD_BATCH = [
    ("draft_token_ids", "abc", TypeError, "draft_token_ids must be an array"),
    ("draft_token_ids", np.zeros(3, np.int64), ValueError, r"draft_token_ids must be 2-D"),
    ("draft_token_ids", np.zeros((2, 3)), TypeError, "draft_token_ids must hold integer"),
    ("draft_token_ids", np.zeros((2, 3), bool), TypeError, "draft_token_ids must hold integer"),
    (
        "draft_token_ids",
        np.full((2, 3), 8),
        ValueError,
        r"draft_token_ids\[0, 0\] is 8, outside the vocabulary \[0, 8\)",
    ),
    (
        "draft_token_ids",
        np.array([[0, 0, -1], [0, 0, 0]]),
        ValueError,
        r"draft_token_ids\[0, 2\] is -1",
    ),
    ("draft_token_ids", np.zeros((3, 3), np.int64), ValueError, r"target_logits must have shape"),
    ("draft", np.zeros((2, 3, 8), np.float16), TypeError, "draft must hold float32 or float64"),
    ("draft", np.zeros((2, 3, 8), np.int64), TypeError, "draft must hold float32 or float64"),
    ("draft", np.zeros((2, 2, 8)), ValueError, r"draft must have shape \(2, 3, V\)"),
    ("draft", np.zeros((2, 3, 9)), ValueError, "draft and target_logits disagree on the vocab"),
    ("draft", np.zeros((3, 8)), ValueError, "draft must be 3-D"),
    (
        "target_logits",
        np.zeros((2, 3, 8)),
        ValueError,
        r"target_logits must have shape \(2, 4, V\)",
    ),
    ("target_logits", np.zeros((2, 4, 8), np.complex128), TypeError, "target_logits must hold"),
    ("target_logits", np.zeros((2, 4, 0)), ValueError, "target_logits has no vocabulary"),
    ("target_logits", [[["a"]]], TypeError, "target_logits must hold float32"),
    ("lengths", [3], ValueError, r"lengths must hold one length per sequence \(2\)"),
    ("lengths", [3, 4], ValueError, r"lengths\[1\] is 4, outside \[0, K = 3\]"),
    ("lengths", [-1, 0], ValueError, r"lengths\[0\] is -1"),
    ("lengths", [1.0, 2.0], TypeError, "lengths must hold integer"),
    ("rngs", None, TypeError, "rngs is required when temperature > 0"),
    ("rngs", np.random.default_rng(0), TypeError, "got a single Generator"),
    ("rngs", 5, TypeError, "got a single int"),
    ("rngs", [1], ValueError, r"rngs must hold one generator or seed per sequence \(2\), got 1"),
    ("rngs", [1, "x"], TypeError, r"rngs\[1\] must be a numpy.random.Generator or an int seed"),
    ("rngs", [1, -2], ValueError, r"rngs\[1\] must be a non-negative int seed"),
    ("rngs", [1, np.random.RandomState(0)], TypeError, r"rngs\[1\]"),
    ("draft_kind", "weights", ValueError, "draft_kind must be 'logits' or 'probs'"),
    ("verification", "tree", ValueError, "verification must be 'block' or 'token'"),
    ("temperature", -1.0, ValueError, "temperature must be finite and >= 0"),
    ("top_k", 0, ValueError, "top_k must be a positive int"),
    ("top_p", 1.5, ValueError, "top_p must be in"),
    ("min_p", "x", TypeError, "min_p must be a number"),
    ("n_threads", 0, ValueError, "n_threads must be a positive int"),
    ("n_threads", 1.5, TypeError, "n_threads must be a positive int"),
    ("n_threads", True, TypeError, "n_threads must be a positive int"),
    ("backend", "fortran", ValueError, "backend must be"),
]


@pytest.mark.parametrize(
    "name, value, error, match", BAD_BATCH, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BAD_BATCH)]
)
def test_verify_batch_rejects_bad_arguments(backend, name, value, error, match):
    arguments = _good()
    kwargs = {"backend": backend}
    if name in arguments:
        arguments[name] = value
    else:
        kwargs[name] = value
    rngs = arguments.pop("rngs")
    states = (
        [copy.deepcopy(g.bit_generator.state) for g in rngs if isinstance(g, np.random.Generator)]
        if isinstance(rngs, list)
        else []
    )
    if name != "backend":
        kwargs["backend"] = backend
    with pytest.raises(error, match=match):
        verify_batch(*arguments.values(), rngs=rngs, **kwargs)
    if isinstance(rngs, list) and rngs and isinstance(rngs[0], np.random.Generator):
        assert same_state(rngs[0].bit_generator.state, states[0])  # nothing drawn


def test_a_generator_shared_by_two_sequences_is_refused(backend):
    arguments = _good()
    shared = np.random.default_rng(0)
    for rngs in ([shared, shared], [shared, np.random.Generator(shared.bit_generator)]):
        with pytest.raises(ValueError, match=r"rngs\[0\] and rngs\[1\] share one bit generator"):
            verify_batch(*list(arguments.values())[:4], rngs=rngs, backend=backend)


BAD_SINGLE = [
    ("draft_token_ids", [[0, 0]], ValueError, "draft_token_ids must be 1-D"),
    ("draft_token_ids", [0, 9], ValueError, r"draft_token_ids\[1\] is 9, outside"),
    ("draft_token_ids", [0, 0, 0], ValueError, r"target_logits must have shape \(4, V\)"),
    ("draft", np.zeros((3, 8)), ValueError, r"draft must have shape \(2, V\)"),
    ("draft", np.zeros((2, 2, 8)), ValueError, "draft must be 2-D"),
    ("target_logits", np.zeros((2, 3, 8)), ValueError, "target_logits must be 2-D"),
    ("rng", "seed", TypeError, "rng must be a numpy.random.Generator or an int seed"),
    ("rng", [np.random.default_rng(0)], TypeError, "rng must be"),
]


@pytest.mark.parametrize(
    "name, value, error, match",
    BAD_SINGLE,
    ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BAD_SINGLE)],
)
def test_verify_rejects_bad_arguments(backend, name, value, error, match):
    rng = np.random.default_rng(0)
    arguments = {
        "draft_token_ids": [0, 1],
        "draft": rng.standard_normal((2, 8)),
        "target_logits": rng.standard_normal((3, 8)),
    }
    kwargs = {"rng": 0, "backend": backend}
    if name in arguments:
        arguments[name] = value
    else:
        kwargs[name] = value
    with pytest.raises(error, match=match):
        verify(*arguments.values(), **kwargs)


def test_public_functions_have_numpydoc_docstrings():
    for function in (verify, verify_batch):
        assert "Parameters\n    ----------" in function.__doc__
        assert "Returns\n    -------" in function.__doc__
    assert "Attributes" in engine.BatchResult.__doc__


# --- the compiled batch kernel's own guards -----------------------------------------------


@pytest.mark.skipif(PURE_PYTHON, reason="no compiled core in a pure-Python install")
def test_the_compiled_batch_kernel_refuses_what_would_read_out_of_bounds():
    """verify_batch checks its inputs before ``_BatchStep``; the kernel checks again what
    would make it read outside the arrays, so a wrong private caller gets an error."""
    from specdec import _core
    from specdec._validation import SamplingControls

    rng = np.random.default_rng(0)
    target = rng.standard_normal((2, 4, 10)).astype(np.float32)
    draft = rng.standard_normal((2, 3, 10)).astype(np.float32)
    ids = np.zeros((2, 3), np.int64)
    lengths = np.array([3, 2], np.int64)
    controls = SamplingControls.from_user(1.0, None, None, None)
    gens = _seeds(2)

    def step(**change):
        args = {"target": target, "draft": draft, "ids": ids, "lengths": lengths}
        args.update(change)
        return _core._BatchStep(
            args["target"], args["draft"], args["ids"], args["lengths"], controls, gens, True
        )

    step()  # the good arguments pass
    with pytest.raises(ValueError, match=r"lengths\[1\] is outside"):
        step(lengths=np.array([3, 4], np.int64))
    with pytest.raises(ValueError, match=r"ids\[0, 2\] is outside"):
        step(ids=np.array([[0, 0, 10], [0, 0, 0]], np.int64))
    with pytest.raises(ValueError, match="rows must be C-contiguous"):
        step(target=np.asfortranarray(target))
    with pytest.raises(TypeError, match="float32 or float64"):
        step(target=target.astype(np.float16))
