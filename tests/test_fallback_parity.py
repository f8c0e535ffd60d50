"""The compiled core and the pure-Python twin make the same decisions, at every SIMD level.

Both backends draw every uniform with one ``next_double`` in the same order and
compute bit-identical weights (see ``_kernels.h``); they differ only by the order of
their sums, so a decision can differ only when a uniform lands within rounding of a
threshold (probability ~1e-15 per decision).  Every test here runs once per SIMD level
this CPU supports (the ``simd_level`` fixture switches the compiled kernels, and with
them the twin's float exp: fused multiply-adds, or separate ones at the x86-64
baseline).  These tests require *identical* output:

* the decoder: hundreds of seeded runs over vocabularies of 2 to 128,256, gammas 1..8,
  temperatures (0 = greedy included), EOS, top-k / top-p / min-p, float32 / float64 /
  mixed logits: same tokens, same statistics counts, same final generator state;
* the kernels: ``sample_token`` and ``verify`` of ``specdec._core`` and
  ``specdec._fallback`` on the same inputs and generator state give the same
  outputs, the same ``law_out`` / ``weights_out`` and leave the generators alike.

Requires the compiled core (these tests compare it with the twin): skipped on a
pure-Python install, where ``specdec._core`` does not exist.
"""

from __future__ import annotations

import numpy as np
import pytest
from law_models import ContextModel, same_state

from specdec import SpeculativeDecoder, sample
from specdec._backend import _use_simd_level, available_backends, available_simd_levels
from specdec._common import LAW_DTYPE
from specdec._validation import SamplingControls

pytestmark = [
    # what an installation can break: .ci/run's wheel stage runs these (-m install)
    pytest.mark.install,
    pytest.mark.skipif(
        "cython" not in available_backends(),
        reason="parity needs the compiled core (pure-Python install)",
    ),
]

DTYPES = [np.float32, np.float64]


@pytest.fixture(autouse=True, scope="module", params=available_simd_levels() or ["none"])
def simd_level(request):
    """Every test of this file once per SIMD level (the compiled kernels switched)."""
    previous = _use_simd_level(request.param)
    yield request.param
    _use_simd_level(previous)


def _kernels():
    from specdec import _core, _fallback

    return _core, _fallback


class TableModel:
    """Zero-cost model over a random table: the row for position i is
    ``table[hash(ids[i-1], ids[i], i) % R]``; honours ``logits_to_keep``."""

    def __init__(self, table):
        self.table = table
        self.vocab_size = table.shape[1]

    def forward(self, ids, logits_to_keep=None):
        ids = np.asarray(ids)[0]
        length = len(ids)
        n = length if logits_to_keep is None else logits_to_keep
        positions = np.arange(length - n, length)
        previous = np.where(positions > 0, ids[np.maximum(positions - 1, 0)], 0)
        key = (ids[positions] * 7919 + previous * 104729 + positions * 31) % self.table.shape[0]
        return self.table[key][np.newaxis]


def table_pair(vocab, seed, noise, draft_dtype, target_dtype, rows=16, scale=3.0):
    """Target rows ~ N(0, scale^2); draft = target + N(0, noise^2): mixed acceptance."""
    rng = np.random.default_rng(seed)
    target = scale * rng.standard_normal((rows, vocab))
    draft = target + noise * rng.standard_normal((rows, vocab))
    return TableModel(draft.astype(draft_dtype)), TableModel(target.astype(target_dtype))


def counts_of(stats):
    return (
        stats.total_tokens_generated,
        stats.total_draft_tokens_proposed,
        stats.total_draft_tokens_accepted,
        stats.num_target_forward_passes,
        stats.num_draft_forward_passes,
        list(stats.accepted_length_histogram),
    )


def run_both(draft, target, prompt, max_new, eos, gamma, temperature, controls, seed):
    """Run both backends from the same seed; return their (ids, counts, generator state)."""
    results = []
    for backend in ("cython", "python"):
        rng = np.random.default_rng(seed)
        decoder = SpeculativeDecoder(gamma, temperature, backend=backend, **controls)
        ids, stats = decoder.generate(draft, target, prompt, max_new, eos, rng=rng)
        results.append((ids, counts_of(stats), rng.bit_generator.state))
    return results


def random_controls(rng, vocab):
    kind = int(rng.integers(0, 5))
    controls = {}
    if kind in (1, 4):
        controls["top_k"] = int(rng.integers(1, vocab + 2))
    if kind in (2, 4):
        controls["top_p"] = float(rng.choice([0.3, 0.5, 0.8, 0.95, 1.0]))
    if kind in (3, 4):
        controls["min_p"] = float(rng.choice([0.0, 0.02, 0.1, 0.5]))
    return controls


# --- the decoder ---------------------------------------------------------------------------


@pytest.mark.parametrize("block", range(4))
def test_decoder_parity_small_vocabularies(block):
    """240 seeded runs (60 per block) over small vocabularies, ties included."""
    master = np.random.default_rng(100 + block)
    decided = {"accepted": 0, "rejected": 0, "eos": 0}
    for _run in range(60):
        vocab = int(master.choice([2, 3, 4, 7, 16, 50]))
        gamma = int(master.integers(1, 9))
        temperature = float(master.choice([0.0, 0.25, 0.7, 1.0, 1.6]))
        dtype_d, dtype_t = (DTYPES[int(i)] for i in master.integers(0, 2, size=2))
        integer = bool(master.integers(0, 4) == 0)  # integer logits: ties everywhere
        draft = ContextModel(
            vocab,
            seed=int(master.integers(1 << 30)),
            dtype=dtype_d,
            scale=float(master.choice([1.0, 2.5])),
            integer=integer,
        )
        target = ContextModel(
            vocab, seed=int(master.integers(1 << 30)), dtype=dtype_t, integer=integer
        )
        prompt = [int(t) for t in master.integers(0, vocab, size=int(master.integers(1, 5)))]
        eos = None if master.integers(0, 3) == 0 else int(master.integers(0, vocab))
        max_new = int(master.integers(1, 26))
        controls = random_controls(master, vocab)
        seed = int(master.integers(1 << 62))
        (ids_c, counts_c, state_c), (ids_p, counts_p, state_p) = run_both(
            draft, target, prompt, max_new, eos, gamma, temperature, controls, seed
        )
        context = (vocab, gamma, temperature, dtype_d, dtype_t, eos, controls, seed)
        assert ids_c == ids_p, context
        assert counts_c == counts_p, context
        assert state_c == state_p, context
        decided["accepted"] += counts_c[2]
        decided["rejected"] += counts_c[1] - counts_c[2]
        decided["eos"] += eos is not None and eos in ids_c[len(prompt) :]
    # the runs exercised both decisions and EOS
    assert decided["accepted"] > 50 and decided["rejected"] > 50 and decided["eos"] > 5


@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.float32),
        (np.float64, np.float64),
        (np.float32, np.float64),
        (np.float64, np.float32),
    ],
    ids=["f32", "f64", "f32-f64", "f64-f32"],
)
def test_decoder_parity_every_gamma_and_dtype(gamma, dtypes):
    for seed in range(6):
        draft, target = table_pair(300, seed, 1.0, *dtypes, rows=32)
        temperature = (0.0, 0.5, 1.0, 1.3, 2.0, 0.05)[seed]
        eos = (None, 7)[seed % 2]
        results = run_both(
            draft, target, [seed, 3], 30, eos, gamma, temperature, {}, seed * 1000 + gamma
        )
        assert results[0] == results[1], (seed, temperature)


@pytest.mark.parametrize(
    "vocab, dtypes, controls, gamma, temperature",
    [
        (1000, (np.float32, np.float32), {}, 4, 1.0),
        (1000, (np.float64, np.float32), {"top_p": 0.9}, 6, 0.7),
        (32000, (np.float32, np.float32), {"top_k": 50}, 4, 1.0),
        (32000, (np.float64, np.float64), {"min_p": 0.05}, 3, 1.2),
        (32000, (np.float32, np.float64), {}, 5, 0.0),
        (128256, (np.float32, np.float32), {}, 4, 1.0),
        (128256, (np.float64, np.float64), {"top_p": 0.8, "top_k": 1000}, 3, 0.9),
        (128256, (np.float32, np.float32), {"top_p": 0.95, "min_p": 0.001}, 4, 1.0),
    ],
    ids=lambda v: str(v) if not isinstance(v, (dict, tuple)) else None,
)
def test_decoder_parity_large_vocabularies(vocab, dtypes, controls, gamma, temperature):
    draft, target = table_pair(vocab, vocab + gamma, 0.8, *dtypes)
    results = run_both(draft, target, [1, 2], 14, None, gamma, temperature, controls, vocab)
    (ids, counts, _), other = results[0], results[1]
    assert results[0] == other
    assert all(0 <= t < vocab for t in ids)
    if temperature > 0 and not controls:
        assert 0 < counts[2] < counts[1]  # some drafts kept, some rejected


def test_sample_parity():
    master = np.random.default_rng(7)
    for run in range(40):
        vocab = int(master.choice([2, 5, 40, 700]))
        dtype = DTYPES[run % 2]
        target = table_pair(vocab, run, 1.0, dtype, dtype, rows=8)[1]
        temperature = float(master.choice([0.0, 0.3, 1.0, 2.0]))
        controls = random_controls(master, vocab)
        eos = None if run % 3 else int(master.integers(0, vocab))
        out = []
        for backend in ("cython", "python"):
            rng = np.random.default_rng(run)
            ids, stats = sample(
                target, [1], 20, eos, temperature=temperature, rng=rng, backend=backend, **controls
            )
            out.append((ids, counts_of(stats), rng.bit_generator.state))
        assert out[0] == out[1], (vocab, dtype, temperature, controls)


# --- the kernels -----------------------------------------------------------------------------


def random_row(rng, vocab, dtype):
    kind = int(rng.integers(0, 6))
    scale = float(rng.choice([0.1, 1.0, 3.0, 10.0]))
    row = scale * rng.standard_normal(vocab)
    if kind == 1:  # masked tokens
        row[rng.random(vocab) < 0.5] = -np.inf
        row[rng.integers(vocab)] = 0.0
    elif kind == 2:  # integer logits: ties at the top, at top-k and top-p boundaries
        row = np.round(row)
    elif kind == 3:  # one-hot
        row = np.full(vocab, -np.inf)
        row[rng.integers(vocab)] = 1.0
    elif kind == 4:  # uniform
        row = np.full(vocab, float(rng.normal()))
    elif kind == 5:  # huge magnitudes
        row = rng.choice([-1e30, 0.0, 1e30], size=vocab)
    return row.astype(dtype)


VOCABS = [1, 2, 3, 10, 511, 512, 513, 1025, 3000]
BIT_GENERATORS = [
    np.random.PCG64,
    np.random.PCG64DXSM,
    np.random.MT19937,
    np.random.Philox,
    np.random.SFC64,
]


def twin_generators(seed, bit_generator=np.random.PCG64):
    return (np.random.Generator(bit_generator(seed)), np.random.Generator(bit_generator(seed)))


def test_sample_token_kernel_parity():
    core, fallback = _kernels()
    master = np.random.default_rng(11)
    for case in range(500):
        vocab = int(master.choice(VOCABS))
        dtype = DTYPES[case % 2]
        row = random_row(master, vocab, dtype)
        temperature = float(master.choice([0.0, 1e-3, 0.3, 1.0, 1.7, 50.0]))
        top_k = int(master.choice([0, 1, 2, 5, vocab]))
        top_p = float(master.choice([1.0, 1.0, 0.9, 0.5, 0.1]))
        min_p = float(master.choice([0.0, 0.0, 0.05, 0.5]))
        rngs = twin_generators(case, BIT_GENERATORS[case % len(BIT_GENERATORS)])
        out = []
        for kernels, rng in zip((core, fallback), rngs, strict=False):
            law = np.full(1, np.nan, LAW_DTYPE)
            weights = np.zeros(vocab, dtype=dtype)
            token = kernels.sample_token(
                row,
                SamplingControls(temperature, top_k, top_p, min_p),
                rng,
                law,
                weights,
                kernels.Workspace(vocab),
            )
            out.append((token, law, weights))
        context = (case, vocab, dtype, temperature, top_k, top_p, min_p)
        (token_c, law_c, w_c), (token_p, law_p, w_p) = out
        assert type(token_c) is int and type(token_p) is int
        assert token_c == token_p, context
        assert 0 <= token_c < vocab
        assert same_state(rngs[0].bit_generator.state, rngs[1].bit_generator.state), context
        if temperature > 0:
            assert np.allclose(law_c["total"], law_p["total"], rtol=1e-12, atol=0), (
                context,
                law_c,
                law_p,
            )
            for field in ("shift", "tau", "zmin"):  # exactly
                assert np.array_equal(law_c[field], law_p[field]), (context, field)
            # weights: bit-identical but for float32 double-rounding ties (see _fallback)
            assert np.allclose(w_c, w_p, rtol=2 * np.finfo(dtype).eps, atol=0), context
            assert np.array_equal(w_c > 0, w_p > 0), context
            assert w_c[token_c] > 0


@pytest.mark.parametrize("block", [False, True], ids=["token", "block"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["model_drafts", "one_hot"])
def test_verify_kernel_parity(block, one_hot):
    core, fallback = _kernels()
    master = np.random.default_rng(12 + 2 * block + one_hot)
    outcomes = {"residual": 0, "bonus": 0, "none": 0}
    shared_work = {}
    for case in range(400):
        vocab = int(master.choice(VOCABS[1:]))
        n = int(master.integers(0, 7))
        target_dtype, draft_dtype = (DTYPES[int(i)] for i in master.integers(0, 2, size=2))
        temperature = float(master.choice([0.0, 1e-3, 0.5, 1.0, 2.0]))
        top_k = int(master.choice([0, 0, 3, vocab]))
        top_p = float(master.choice([1.0, 1.0, 0.8]))
        min_p = float(master.choice([0.0, 0.0, 0.1]))
        controls = SamplingControls(temperature, top_k, top_p, min_p)
        target_rows = np.stack([random_row(master, vocab, np.float64) for _ in range(n + 1)])
        noise = float(master.choice([0.0, 0.3, 2.0]))
        draft_rows = target_rows[:n] + noise * master.standard_normal((n, vocab))
        draft_rows[~np.isfinite(target_rows[:n])] = -np.inf
        target_rows = target_rows.astype(target_dtype)
        draft_rows = draft_rows.astype(draft_dtype)
        # drafts drawn by the twin; identical inputs go to both verify kernels
        laws = np.zeros(n, LAW_DTYPE)
        weights = np.zeros((n, vocab), dtype=draft_dtype)
        tokens = np.zeros(n, dtype=np.int64)
        work = fallback.Workspace(vocab)
        draw = np.random.default_rng(case + 10**6)
        for i in range(n):
            tokens[i] = fallback.sample_token(
                draft_rows[i], controls, draw, laws[i : i + 1], weights[i], work
            )
        if master.integers(0, 4) == 0 and n:  # arbitrary tokens (q may be 0)
            tokens = master.integers(0, vocab, size=n).astype(np.int64)
        bonus = bool(master.integers(0, 4))
        if one_hot:
            weights = laws = None
        rngs = twin_generators(case, BIT_GENERATORS[case % len(BIT_GENERATORS)])
        # one compiled workspace per vocabulary, reused across cases (its per-row storage
        # grows); the twin gets a fresh one
        work = shared_work.setdefault(vocab, core.Workspace(vocab))
        results = [
            kernels.verify(
                target_rows,
                tokens,
                weights,
                laws,
                bonus,
                controls,
                rng,
                work if kernels is core else kernels.Workspace(vocab),
                block,
            )
            for kernels, rng in zip((core, fallback), rngs, strict=False)
        ]
        context = (case, vocab, n, target_dtype, draft_dtype, controls, bonus, noise)
        assert results[0] == results[1], context
        assert same_state(rngs[0].bit_generator.state, rngs[1].bit_generator.state), context
        n_accepted, token = results[0]
        assert 0 <= n_accepted <= n and -1 <= token < vocab
        assert (token == -1) == (n_accepted == n and not bonus), context
        outcomes["residual" if n_accepted < n else "bonus" if token >= 0 else "none"] += 1
    assert min(outcomes.values()) > 20, outcomes


@pytest.mark.parametrize("vocab", [32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_parity_large_vocabulary(vocab, dtype):
    core, fallback = _kernels()
    master = np.random.default_rng(vocab)
    n = 3
    target_rows = (3.0 * master.standard_normal((n + 1, vocab))).astype(dtype)
    draft_rows = (target_rows[:n] + 0.8 * master.standard_normal((n, vocab))).astype(dtype)
    for controls in [
        SamplingControls(1.0, 0, 1.0, 0.0),
        SamplingControls(0.7, 40, 0.9, 0.0),
        SamplingControls(1.3, 0, 0.95, 0.01),
    ]:
        laws = {k: np.zeros(n, LAW_DTYPE) for k in ("c", "p")}
        weights = {k: np.zeros((n, vocab), dtype=dtype) for k in ("c", "p")}
        for seed in range(3):
            rngs = twin_generators(seed)
            tokens = {}
            for key, kernels, rng in (("c", core, rngs[0]), ("p", fallback, rngs[1])):
                work = kernels.Workspace(vocab)
                tokens[key] = np.array(
                    [
                        kernels.sample_token(
                            draft_rows[i],
                            controls,
                            rng,
                            laws[key][i : i + 1],
                            weights[key][i],
                            work,
                        )
                        for i in range(n)
                    ],
                    dtype=np.int64,
                )
            assert np.array_equal(tokens["c"], tokens["p"])
            assert np.allclose(laws["c"]["total"], laws["p"]["total"], rtol=1e-12, atol=0)
            assert np.allclose(weights["c"], weights["p"], rtol=2 * np.finfo(dtype).eps, atol=0)
            verdicts = [
                kernels.verify(
                    target_rows,
                    tokens["p"],
                    weights["p"],
                    laws["p"],
                    True,
                    controls,
                    rng,
                    kernels.Workspace(vocab),
                )
                for kernels, rng in zip((core, fallback), rngs, strict=False)
            ]
            assert verdicts[0] == verdicts[1]
            assert same_state(rngs[0].bit_generator.state, rngs[1].bit_generator.state)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_are_the_twins_bit_for_bit(dtype, simd_level):
    """At every level, the twin computes the level's weights: the x86-64 baseline rounds
    the float exp's multiply-adds separately (no FMA), and the twin follows it there;
    with fused ones on the twin's side, about 1% of these weights differ by one ulp."""
    core, fallback = _kernels()
    vocab = 50_000
    row = (4.0 * np.random.default_rng(5).standard_normal(vocab)).astype(dtype)
    weights = []
    for kernels in (core, fallback):
        law, w = np.zeros(1, LAW_DTYPE), np.zeros(vocab, dtype=dtype)
        controls = SamplingControls(0.8)
        kernels.sample_token(
            row, controls, np.random.default_rng(0), law, w, kernels.Workspace(vocab)
        )
        weights.append(w)
    assert np.array_equal(weights[0], weights[1]), (simd_level, np.mean(weights[0] != weights[1]))
