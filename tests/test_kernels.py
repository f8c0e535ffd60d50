"""Property tests of the kernels (``sample_token``, ``verify``, ``Workspace``).

Rows of logits come from Hypothesis: arbitrary floats with -inf masks, one-hot and
uniform rows, huge (1e30) and tiny (1e-30) magnitudes, V = 1, and seeded random rows
across the 512-element block boundary; temperatures from 1e-3 up, and 0 (greedy);
top-k / top-p / min-p.  For every example, on each backend (``kernels`` fixture):

* the sampled id lies in [0, V) and has positive probability under the warped law,
  whose support is computed here independently (exact thresholds for masks and
  top-k; top-p and min-p with a rounding margin that only ever *widens* it);
* greedy picks the lowest id among the maxima;
* the compiled core and the Python twin return the same id, the same law and leave
  their generators in the same state (exact equality: their weights are
  bit-identical and only a uniform within ~1e-15 of a threshold could split them);
* ``verify`` returns n_accepted in [0, n] and a token in the support of the row it
  was drawn from; never returns a rejected draft from a non-empty residual; keeps
  every draft when draft and target agree;
* NaN, +inf and all -inf rows raise ``InvalidLogitsError`` (a ValueError) with the
  index of the row; mismatched shapes raise ValueError, never crash.

The suite runs a few hundred examples per property (a few seconds); set
``SPECDEC_HYPOTHESIS_SCALE=20`` for a deep run.
"""

from __future__ import annotations

import math
import os
from dataclasses import astuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from law_models import ContextModel, same_state

from specdec._backend import _use_simd_level, available_backends, available_simd_levels, kernels_for
from specdec._common import (
    ALL_MASKED_LOGITS,
    LAW_DTYPE,
    NONFINITE_LOGITS,
    SHIFT_LIMIT,
    InvalidLogitsError,
)
from specdec._validation import SamplingControls

# derandomize: CI runs the same examples every time (a deep run can set
# SPECDEC_HYPOTHESIS_RANDOM=1 to explore new ones).
SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not os.environ.get("SPECDEC_HYPOTHESIS_RANDOM"),
)
#: Multiplies every max_examples (e.g. SPECDEC_HYPOTHESIS_SCALE=20 for a deep run).
SCALE = float(os.environ.get("SPECDEC_HYPOTHESIS_SCALE", "1"))


def examples(n):
    return max(1, int(n * SCALE))


DTYPES = [np.float32, np.float64]


def twin_of(kernels):
    """The other backend's kernel module, or None on a pure-Python install."""
    if "cython" not in available_backends():
        return None
    return kernels_for("python" if kernels.__name__.endswith("_core") else "cython")


# --- an independent oracle of the support -----------------------------------------------------


def possible(row, temperature, top_k=0, top_p=1.0, min_p=0.0, slack=1e-5):
    """Tokens that may have positive probability under the warped law.

    Exact for masks, greedy and top-k; top-p and min-p are widened by a relative
    ``slack`` so that rounding (float32 weights) can only make the set larger.
    Written from the definitions with a sort, in float64 / exact exp.
    """
    x = np.asarray(row, dtype=np.float64)
    n = len(x)
    m = x.max()
    if temperature == 0:
        keep = np.zeros(n, dtype=bool)
        keep[int(np.flatnonzero(x == m)[0])] = True
        return keep
    keep = x > -np.inf
    if 0 < top_k < n:
        keep &= x >= np.sort(x)[n - top_k]
    with np.errstate(invalid="ignore", over="ignore"):
        z = (x - m) / temperature
    w = np.where(keep, np.exp(z), 0.0)
    if top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        mass = np.cumsum(w[order])
        goal = top_p * w.sum() * (1 + slack)
        i = min(int(np.searchsorted(mass, goal, side="left")), n - 1)
        keep &= x >= x[order[i]]
    if min_p > 0.0:
        keep &= z >= math.log(min_p) - slack * (1 + np.abs(z))
    return keep


# --- strategies -----------------------------------------------------------------------------


def finite_floats(dtype, bound):
    bound = float(dtype(bound))  # representable in the row's type
    return st.floats(
        -bound,
        bound,
        allow_nan=False,
        allow_infinity=False,
        width=32 if dtype is np.float32 else 64,
    )


@st.composite
def rows(draw, dtype=None, vocab=None, max_vocab=24):
    """One row of logits (at least one finite value)."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    kind = draw(
        st.sampled_from(["floats", "floats", "onehot", "uniform", "huge", "tiny", "seeded"])
    )
    if kind == "seeded" and vocab is None:
        vocab = draw(st.sampled_from([1, 2, 511, 512, 513, 1100]))
    if vocab is None:
        vocab = draw(st.integers(1, max_vocab))
    if vocab > 64 and kind in ("floats", "huge", "tiny"):
        kind = "seeded"  # long rows from NumPy: Hypothesis lists of 1000 floats are slow
    if kind == "floats":
        elements = st.one_of(finite_floats(dtype, 1e4), st.just(-np.inf))
        row = np.array(draw(st.lists(elements, min_size=vocab, max_size=vocab)))
    elif kind == "onehot":
        row = np.full(vocab, -np.inf)
        row[draw(st.integers(0, vocab - 1))] = draw(finite_floats(dtype, 1e30))
    elif kind == "uniform":
        row = np.full(vocab, draw(finite_floats(dtype, 1e30)))
    elif kind == "huge":
        row = np.array(
            draw(
                st.lists(
                    st.sampled_from([1e30, -1e30, 0.0, -np.inf]), min_size=vocab, max_size=vocab
                )
            )
        )
    elif kind == "tiny":
        row = np.array(draw(st.lists(finite_floats(dtype, 1e-30), min_size=vocab, max_size=vocab)))
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        row = draw(st.sampled_from([0.3, 3.0, 30.0])) * rng.standard_normal(vocab)
        row[rng.random(vocab) < draw(st.sampled_from([0.0, 0.5, 0.99]))] = -np.inf
    if not np.isfinite(row).any():
        row[draw(st.integers(0, vocab - 1))] = 0.0
    return row.astype(dtype)


temperatures = st.one_of(
    st.sampled_from([0.0, 1e-3, 0.01, 0.5, 1.0, 2.0, 100.0]), st.floats(1e-3, 10.0)
)


@st.composite
def controls(draw, vocab):
    top_k = draw(st.one_of(st.just(0), st.integers(1, vocab + 1)))
    top_p = draw(st.one_of(st.just(1.0), st.floats(0.01, 1.0)))
    min_p = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.99)))
    return top_k, top_p, min_p


@st.composite
def sample_cases(draw):
    row = draw(rows())
    return (row, draw(temperatures), *draw(controls(len(row))), draw(st.integers(0, 2**63)))


def run_sample(kernels, row, temperature, top_k, top_p, min_p, seed):
    rng = np.random.default_rng(seed)
    law = np.full(1, np.nan, LAW_DTYPE)
    weights = np.zeros(len(row), dtype=row.dtype)
    token = kernels.sample_token(
        row,
        SamplingControls(temperature, top_k, top_p, min_p),
        rng,
        law,
        weights,
        kernels.Workspace(len(row)),
    )
    return token, law, weights, rng.bit_generator.state


# --- sample_token ------------------------------------------------------------------------------


@settings(max_examples=examples(300), **SETTINGS)
@given(case=sample_cases())
def test_sample_token_properties(kernels, case):
    row, temperature, top_k, top_p, min_p, seed = case
    token, law, weights, state = run_sample(kernels, row, temperature, top_k, top_p, min_p, seed)
    assert type(token) is int
    assert 0 <= token < len(row)
    assert possible(row, temperature, top_k, top_p, min_p)[token]
    if temperature == 0:
        assert token == int(np.flatnonzero(row == row.max())[0])
        assert same_state(state, np.random.default_rng(seed).bit_generator.state)  # no draw
    else:
        assert weights[token] > 0 and law["total"] > 0
        # law["shift"] is the shift of the weights: the maximum, or without controls the
        # first block's maximum when the row's own is within SHIFT_LIMIT of it
        shift = float(law["shift"][0])
        assert shift in row and shift <= row.max()
        assert (float(row.max()) - shift) / temperature <= SHIFT_LIMIT
        if top_k or top_p < 1 or min_p > 0:
            assert shift == row.max()
    twin = twin_of(kernels)
    if twin is not None:
        other, other_law, other_weights, other_state = run_sample(
            twin, row, temperature, top_k, top_p, min_p, seed
        )
        assert token == other
        assert same_state(state, other_state)
        if temperature > 0:
            assert np.allclose(law["total"], other_law["total"], rtol=1e-12, atol=0)
            for field in ("shift", "tau", "zmin"):
                assert np.array_equal(law[field], other_law[field])
            assert np.array_equal(weights > 0, other_weights > 0)


@settings(max_examples=examples(60), **SETTINGS)
@given(row=rows(), seed=st.integers(0, 2**63))
def test_sample_token_only_masks_nothing_when_controls_are_off(kernels, row, seed):
    """With no controls every finite logit has positive weight (up to the flush of
    weights below the smallest normal number, exp(-87) in float32)."""
    token, law, weights, _ = run_sample(kernels, row, 1.0, 0, 1.0, 0.0, seed)
    z = (row - row.max()).astype(np.float64)  # in the row's type, as the kernels
    lowest = -87.0 if row.dtype == np.float32 else -708.0
    assert np.array_equal(weights > 0, z >= lowest)
    assert law["tau"] == -np.inf and law["zmin"] == -np.inf


@settings(max_examples=examples(40), **SETTINGS)
@given(
    vocab=st.integers(1, 30),
    seed=st.integers(0, 2**63),
    dtype=st.sampled_from(DTYPES),
    temperature=temperatures,
)
def test_one_hot_and_single_token(kernels, vocab, seed, dtype, temperature):
    index = seed % vocab
    row = np.full(vocab, -np.inf, dtype=dtype)
    row[index] = 3.0
    assert run_sample(kernels, row, temperature, 0, 1.0, 0.0, seed)[0] == index
    one = np.array([seed % 1000 - 500.0], dtype=dtype)
    assert run_sample(kernels, one, temperature, 1, 0.5, 0.5, seed)[0] == 0


def test_uniform_row_draws_every_token(kernels):
    """A uniform row (also at temperature 1e-3 and with huge values) reaches every id."""
    for value in (0.0, 1e30, -1e30):
        for temperature in (1.0, 1e-3):
            row = np.full(7, value)
            rng = np.random.default_rng(0)
            seen = {
                kernels.sample_token(
                    row,
                    SamplingControls(temperature),
                    rng,
                    np.zeros(1, LAW_DTYPE),
                    np.zeros(7),
                    kernels.Workspace(7),
                )
                for _ in range(300)
            }
            assert seen == set(range(7)), (value, temperature)


# --- verify ------------------------------------------------------------------------------------


@st.composite
def verify_cases(draw):
    dtype_t, dtype_d = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
    vocab = draw(st.one_of(st.integers(1, 12), st.sampled_from([513, 1100])))
    n = draw(st.integers(0, 4))
    target = np.stack([draw(rows(np.float64, vocab)) for _ in range(n + 1)])
    relation = draw(st.sampled_from(["same", "near", "independent"]))
    if relation == "same":  # same values and dtype: p == q bit for bit
        draft, dtype_d = target[:n].copy(), dtype_t
    elif relation == "near":
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        draft = target[:n] + 0.5 * rng.standard_normal((n, vocab))
    else:
        draft = np.stack([draw(rows(np.float64, vocab)) for _ in range(n)]) if n else target[:0]
    temperature = draw(temperatures)
    top_k, top_p, min_p = draw(controls(vocab))
    arbitrary = draw(st.booleans()) and relation != "same"
    return dict(
        target=target.astype(dtype_t),
        draft=draft.astype(dtype_d),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        arbitrary_tokens=arbitrary,
        relation=relation,
        bonus=draw(st.booleans()),
        seed=draw(st.integers(0, 2**63)),
        block=draw(st.booleans()),
        one_hot=draw(st.booleans()),
    )


def make_drafts(kernels, case):
    """Draft tokens drawn from the draft rows by ``sample_token``, with their laws and
    weights (or arbitrary tokens, whose q may be 0)."""
    draft, vocab = case["draft"], case["target"].shape[1]
    n = len(draft)
    controls = SamplingControls(case["temperature"], case["top_k"], case["top_p"], case["min_p"])
    laws = np.zeros(n, LAW_DTYPE)
    weights = np.zeros((n, vocab), dtype=draft.dtype)
    tokens = np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(case["seed"] ^ 0x5EED)
    for i in range(n):
        tokens[i] = kernels.sample_token(
            draft[i], controls, rng, laws[i : i + 1], weights[i], kernels.Workspace(vocab)
        )
    if case["arbitrary_tokens"]:
        tokens = np.random.default_rng(case["seed"]).integers(0, vocab, size=n)
    return tokens, laws, weights, controls


@settings(max_examples=examples(250), **SETTINGS)
@given(case=verify_cases())
def test_verify_properties(kernels, case):
    """Both schemes (``block``), drafts from a model or one-hot (a deterministic drafter
    proposing the same tokens)."""
    target, vocab = case["target"], case["target"].shape[1]
    n = len(case["draft"])
    tokens, laws, weights, controls = make_drafts(kernels, case)
    if case["one_hot"]:
        laws = weights = None
    rng = np.random.default_rng(case["seed"])
    n_accepted, token = kernels.verify(
        target,
        tokens,
        weights,
        laws,
        case["bonus"],
        controls,
        rng,
        kernels.Workspace(vocab),
        case["block"],
    )
    assert type(n_accepted) is int and type(token) is int
    assert 0 <= n_accepted <= n
    if n_accepted == n and not case["bonus"]:
        assert token == -1
    else:
        assert 0 <= token < vocab
        assert possible(target[n_accepted], *astuple(controls))[token]
    temperature = controls.temperature
    if temperature == 0:
        best = [int(np.flatnonzero(r == r.max())[0]) for r in target]
        expected = next((i for i in range(n) if tokens[i] != best[i]), n)
        assert n_accepted == expected
        if token >= 0:
            assert token == best[n_accepted]
    elif case["relation"] == "same" and not case["arbitrary_tokens"] and not case["one_hot"]:
        assert n_accepted == n  # p == q at every draft: every ratio and h is 1
    if temperature > 0 and n_accepted < n and case["one_hot"]:
        # the residual is p without the rejected draft (unless that leaves nothing)
        others = possible(target[n_accepted], *astuple(controls))
        others[tokens[n_accepted]] = False
        assert token != tokens[n_accepted] or not others.any()
    if temperature > 0 and n_accepted < n and not case["one_hot"]:
        # the rejected draft x had p(x) <= u q(x) < q(x): the residual has no mass at x
        # (unless it is empty in floating point and the kernels fall back on p).  For
        # block verification the residual max(0, p_tau p - q) lies inside max(0, p - q).
        p_law, p_weights = np.zeros(1, LAW_DTYPE), np.zeros(vocab, dtype=target.dtype)
        twin = kernels_for("python")
        twin.sample_token(
            target[n_accepted],
            controls,
            np.random.default_rng(0),
            p_law,
            p_weights,
            twin.Workspace(vocab),
        )
        # as the kernels do it: weight times the reciprocal of the total
        p = p_weights.astype(np.float64) * (1.0 / p_law["total"][0])
        q = weights[n_accepted].astype(np.float64) * (1.0 / laws["total"][n_accepted])
        if np.where(p > q, p - q, 0.0).sum() > 0:
            assert p[token] > q[token]
            assert token != tokens[n_accepted] or q[token] == 0
    twin = twin_of(kernels)
    if twin is not None:
        other_rng = np.random.default_rng(case["seed"])
        assert twin.verify(
            target,
            tokens,
            weights,
            laws,
            case["bonus"],
            controls,
            other_rng,
            twin.Workspace(vocab),
            case["block"],
        ) == (n_accepted, token)
        assert same_state(rng.bit_generator.state, other_rng.bit_generator.state)


# --- invalid rows ------------------------------------------------------------------------------


def spoil(row, how, index):
    row = row.copy()
    if how == "nan":
        row[index] = np.nan
    elif how == "inf":
        row[index] = np.inf
    else:
        row[:] = -np.inf
    return row


CODES = {"nan": NONFINITE_LOGITS, "inf": NONFINITE_LOGITS, "all_masked": ALL_MASKED_LOGITS}


def test_invalid_logits_error_is_a_value_error():
    assert issubclass(InvalidLogitsError, ValueError)


@settings(max_examples=examples(80), **SETTINGS)
@given(
    row=rows(),
    how=st.sampled_from(list(CODES)),
    where=st.integers(0, 2**16),
    temperature=temperatures,
    seed=st.integers(0, 2**63),
)
def test_sample_token_rejects_rows_without_a_law(kernels, row, how, where, temperature, seed):
    bad = spoil(row, how, where % len(row))
    with pytest.raises(InvalidLogitsError) as info:
        run_sample(kernels, bad, temperature, 0, 0.9, 0.1, seed)
    assert info.value.row == 0 and info.value.code == CODES[how]
    assert isinstance(info.value, ValueError)
    assert ("NaN" in str(info.value)) == (how != "all_masked")


@settings(max_examples=examples(80), **SETTINGS)
@given(
    vocab=st.integers(1, 600),
    n=st.integers(0, 4),
    data=st.data(),
    how=st.sampled_from(list(CODES)),
    dtype=st.sampled_from(DTYPES),
    temperature=temperatures,
    seed=st.integers(0, 2**63),
)
def test_verify_rejects_the_row_it_reaches(kernels, vocab, n, data, how, dtype, temperature, seed):
    """Draft and target agree before the bad row, so the decision reaches it; with
    every draft kept, the bonus row (index n) is reached too."""
    bad_index = data.draw(st.integers(0, n))
    rng = np.random.default_rng(seed)
    target = (2.0 * rng.standard_normal((n + 1, vocab))).astype(dtype)
    case = dict(
        draft=target[:n].copy(),
        target=target,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        arbitrary_tokens=False,
        seed=seed,
    )
    tokens, laws, weights, controls = make_drafts(kernels, case)
    target[bad_index] = spoil(target[bad_index], how, int(rng.integers(vocab)))
    with pytest.raises(InvalidLogitsError) as info:
        kernels.verify(target, tokens, weights, laws, True, controls, rng, kernels.Workspace(vocab))
    assert info.value.row == bad_index and info.value.code == CODES[how]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("controls", [(0, 1.0, 0.0), (0, 0.9, 0.1)], ids=["plain", "top_p"])
def test_every_position_of_a_bad_logit_is_found_at_every_level(kernels, backend, dtype, controls):
    """The maximum pass finds NaN and +inf wherever they sit: in every lane of the
    partial maxima (clang's form keeps 32), in the tail after the last full group of
    lanes, in the first block (the plain path's shift) and the blocks after it."""
    levels = available_simd_levels() if backend == "cython" else [None]
    for level in levels:
        previous = _use_simd_level(level) if level else None
        try:
            for vocab in (1, 31, 32, 33, 95, 512, 513, 1100):
                row = np.linspace(-3.0, 3.0, vocab).astype(dtype)
                positions = set(range(min(vocab, 70))) | {vocab - 1, vocab // 2, 511 % vocab}
                for index in sorted(positions):
                    for how in ("nan", "inf"):
                        with pytest.raises(InvalidLogitsError) as info:
                            run_sample(kernels, spoil(row, how, index), 1.0, *controls, 0)
                        assert info.value.code == NONFINITE_LOGITS, (level, vocab, index, how)
        finally:
            if previous:
                _use_simd_level(previous)


# --- workspace and shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [0, -1, -(2**40)])
def test_workspace_rejects_an_empty_vocabulary(kernels, vocab_size):
    with pytest.raises(ValueError, match="vocab_size"):
        kernels.Workspace(vocab_size)


def test_workspace_of_one(kernels):
    work = kernels.Workspace(1)
    assert work.vocab_size == 1
    assert (
        kernels.sample_token(
            np.array([2.5]),
            SamplingControls(),
            np.random.default_rng(0),
            np.zeros(1, LAW_DTYPE),
            np.zeros(1),
            work,
        )
        == 0
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alias", ["weights_out is logits", "law_out in weights_out", "overlap"])
def test_sample_token_refuses_outputs_that_share_the_logits_memory(kernels, dtype, alias):
    # The compiled kernel wrote its weights into the logits it still read, and picked
    # another token than the twin (which computes into temporaries).
    n = 100
    memory = np.random.default_rng(1).standard_normal(2 * n).astype(dtype)
    logits, weights, law = memory[:n], np.zeros(n, dtype), np.zeros(1, LAW_DTYPE)
    if alias == "weights_out is logits":
        weights = logits
    elif alias == "law_out in weights_out":
        law = weights.view(np.uint8)[: LAW_DTYPE.itemsize].view(LAW_DTYPE)
    else:
        weights = memory[n // 2 : n // 2 + n]
    with pytest.raises(ValueError, match="^sample_token: weights_out and the law output must"):
        kernels.sample_token(
            logits, SamplingControls(1.0), np.random.default_rng(0), law, weights,
            kernels.Workspace(n),
        )  # fmt: skip


@pytest.mark.parametrize(
    "alias", ["weights_out is rows", "laws_out in rows", "laws_out in weights_out"]
)
def test_row_laws_refuses_outputs_that_share_the_rows_memory(kernels, alias):
    rows = np.zeros((1, 1000), np.float32)
    rows[0, 700] = 100.0
    weights, laws = np.zeros((1, 1000), np.float32), np.zeros(1, LAW_DTYPE)
    if alias == "weights_out is rows":
        weights = rows
    elif alias == "laws_out in rows":
        laws = rows.view(np.uint8)[0, : LAW_DTYPE.itemsize].view(LAW_DTYPE)
    else:
        laws = weights.view(np.uint8)[0, : LAW_DTYPE.itemsize].view(LAW_DTYPE)
    with pytest.raises(ValueError, match="^row_laws: weights_out and the law output must"):
        kernels.row_laws(rows, SamplingControls(1.0), laws, weights, kernels.Workspace(1000))


def _verify_args(kernels, vocab=5, n=2, temperature=1.0, **changes):
    laws = np.zeros(n, LAW_DTYPE)
    laws["tau"] = laws["zmin"] = -np.inf
    laws["total"] = vocab
    args = dict(
        target_rows=np.zeros((n + 1, vocab)),
        draft_tokens=np.arange(n, dtype=np.int64),
        draft_weights=np.ones((n, vocab)),
        draft_laws=laws,
        bonus=True,
        controls=SamplingControls(temperature),
        rng=np.random.default_rng(0),
        work=kernels.Workspace(vocab),
        block=False,
    )
    args.update(changes)
    return list(args.values())


SHAPE_ERRORS = {
    "target_rows_too_few": {"target_rows": np.zeros((2, 5))},
    "target_rows_too_many": {"target_rows": np.zeros((4, 5))},
    "target_rows_wrong_vocab": {"target_rows": np.zeros((3, 4))},
    "draft_weights_too_few": {"draft_weights": np.ones((1, 5))},
    "draft_weights_wrong_vocab": {"draft_weights": np.ones((2, 6))},
    "draft_laws_too_few": {"draft_laws": np.ones(1, LAW_DTYPE)},
    "draft_token_too_large": {"draft_tokens": np.array([1, 5])},
    "draft_token_negative": {"draft_tokens": np.array([-1, 0])},
    "draft_token_huge": {"draft_tokens": np.array([0, 2**62])},
    "workspace_too_small": {"work": "small"},
    "workspace_too_large": {"work": "large"},
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", list(SHAPE_ERRORS))
def test_verify_rejects_mismatched_shapes(kernels, case, temperature):
    changes = dict(SHAPE_ERRORS[case])
    if changes.get("work") == "small":
        changes["work"] = kernels.Workspace(4)
    elif changes.get("work") == "large":
        changes["work"] = kernels.Workspace(6)
    with pytest.raises(ValueError, match="verify"):
        kernels.verify(*_verify_args(kernels, temperature=temperature, **changes))


@pytest.mark.parametrize(
    "tokens, bad",
    [
        (np.array([0, -1], dtype=np.int64), -1),
        (np.array([5, 1], dtype=np.int64), 5),
        (np.array([1, 2**40], dtype=np.int64), 2**40),
        (np.array([1, 2**63 + 7], dtype=np.uint64), 2**63 + 7),  # not wrapped to negative
        (np.array([0, 9], dtype=np.int32), 9),
    ],
)
@pytest.mark.parametrize("block", [False, True])
def test_verify_names_a_token_outside_the_vocabulary(kernels, tokens, bad, block):
    # The compiled core checks int64 tokens in its own loop (not NumPy's min / max).
    with pytest.raises(ValueError, match=rf"^verify: draft token {bad} is outside \[0, 5\)$"):
        kernels.verify(*_verify_args(kernels, draft_tokens=tokens, block=block))


@pytest.mark.parametrize("case", ["wrong_rank", "tokens_2d"])
def test_verify_rejects_wrong_ranks(kernels, case):
    changes = (
        {"target_rows": np.zeros(5)}
        if case == "wrong_rank"
        else {"draft_tokens": np.array([[0, 1]])}
    )
    with pytest.raises((ValueError, TypeError)):
        kernels.verify(*_verify_args(kernels, **changes))


@pytest.mark.parametrize(
    "laws",
    [
        np.ones((2, 4)),
        np.ones((2, 3)),
        np.ones(2, [("total", "f8")]),
        [(0.0, 0.0, 0.0, 1.0)] * 2,
        np.ones((2, 1), LAW_DTYPE),
    ],
)
def test_verify_rejects_laws_that_are_not_law_dtype(kernels, laws):
    with pytest.raises((TypeError, ValueError), match="verify: draft_laws"):
        kernels.verify(*_verify_args(kernels, draft_laws=laws))


@pytest.mark.parametrize(
    "case", ["short_logits", "long_logits", "short_law", "short_weights", "long_weights"]
)
def test_sample_token_rejects_mismatched_sizes(kernels, case):
    logits, law, weights = np.zeros(5), np.zeros(1, LAW_DTYPE), np.zeros(5)
    if case == "short_logits":
        logits = np.zeros(4)
    elif case == "long_logits":
        logits = np.zeros(6)
    elif case == "short_law":
        law = np.zeros(0, LAW_DTYPE)
    elif case == "short_weights":
        weights = np.zeros(4)
    else:
        weights = np.zeros(6)
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError):
            kernels.sample_token(
                logits,
                SamplingControls(temperature),
                np.random.default_rng(0),
                law,
                weights,
                kernels.Workspace(5),
            )


def test_sample_token_rejects_weights_of_another_dtype(kernels):
    with pytest.raises((ValueError, TypeError)):
        kernels.sample_token(
            np.zeros(5),
            SamplingControls(),
            np.random.default_rng(0),
            np.zeros(1, LAW_DTYPE),
            np.zeros(5, dtype=np.float32),
            kernels.Workspace(5),
        )


# --- regressions found in review ------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("vocab", [20, 300, 5000])
def test_top_p_within_rounding_of_one_keeps_every_token(kernels, dtype, vocab):
    # The mass target top_p * Z can be out of reach by rounding: every token must stay
    # (the compiled core once returned a leftover logit as the threshold).
    rng = np.random.default_rng(11)
    for trial in range(20):
        row = rng.uniform(-3, 0, vocab).astype(dtype)
        law, weights = np.zeros(1, LAW_DTYPE), np.empty(vocab, dtype)
        kernels.sample_token(
            row,
            SamplingControls(1.0, 0, float(np.nextafter(1.0, 0.0))),
            np.random.default_rng(trial),
            law,
            weights,
            kernels.Workspace(vocab),
        )
        assert law["tau"] == -np.inf or law["tau"] <= row.min(), (trial, law)
        assert np.all(weights > 0)


def test_top_k_beyond_any_vocabulary_keeps_every_token(backend):
    from specdec import sample

    model = ContextModel(5, seed=2)
    plain = sample(model, [1], 20, seed=3, backend=backend)[0]
    assert sample(model, [1], 20, seed=3, top_k=2**64, backend=backend)[0] == plain


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gap", [10.0, 63.0, 65.0, 300.0])
def test_provisional_shift_and_its_redo(kernels, dtype, gap):
    # Without controls the weights are shifted by the first block's maximum; a row whose
    # maximum lies more than SHIFT_LIMIT above it is redone from the maximum (else float
    # weights would overflow).  Both ways the law and the twin's answer are the same.
    vocab = 3 * 512
    rng = np.random.default_rng(int(gap))
    row = rng.normal(size=vocab).astype(dtype)
    row[:512] -= gap
    row[700] = row[512:].max() + 1.0  # the one token that matters
    head_max = float(row[:512].max())
    law, weights = np.zeros(1, LAW_DTYPE), np.empty(vocab, dtype)
    token = kernels.sample_token(
        row, SamplingControls(), np.random.default_rng(0), law, weights, kernels.Workspace(vocab)
    )
    expected_shift = float(row.max()) if float(row.max()) - head_max > SHIFT_LIMIT else head_max
    assert law["shift"] == expected_shift
    assert np.all(np.isfinite(weights)) and np.isfinite(law["total"])
    probs = weights.astype(np.float64) / law["total"]
    exact = np.exp(row.astype(np.float64) - row.max())
    np.testing.assert_allclose(probs, exact / exact.sum(), rtol=1e-5, atol=1e-30)
    twin = twin_of(kernels)
    if twin is not None:
        other_law, other_weights = np.zeros(1, LAW_DTYPE), np.empty(vocab, dtype)
        other = twin.sample_token(
            row,
            SamplingControls(),
            np.random.default_rng(0),
            other_law,
            other_weights,
            twin.Workspace(vocab),
        )
        assert other == token and np.array_equal(other_weights, weights)


# --- row_laws ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("controls", [SamplingControls(), SamplingControls(0.7, 3, 0.9, 0.05)])
def test_row_laws_are_sample_tokens_laws(kernels, dtype, controls):
    """row_laws fills the law and weights sample_token would, row by row, drawing nothing."""
    rng = np.random.default_rng(5)
    rows = (2.0 * rng.standard_normal((4, 700))).astype(dtype)
    rows[1, ::3] = -np.inf
    laws, weights = np.zeros(4, LAW_DTYPE), np.zeros((4, 700), dtype)
    state = rng.bit_generator.state
    kernels.row_laws(rows, controls, laws, weights, kernels.Workspace(700))
    assert same_state(state, rng.bit_generator.state)
    for i in range(4):
        law, w = np.zeros(1, LAW_DTYPE), np.zeros(700, dtype)
        kernels.sample_token(
            rows[i], controls, np.random.default_rng(0), law, w, kernels.Workspace(700)
        )
        assert law[0] == laws[i] and np.array_equal(w, weights[i])


def test_row_laws_names_the_bad_row(kernels):
    rows = np.zeros((3, 5))
    rows[2, 1] = np.nan
    with pytest.raises(InvalidLogitsError) as info:
        kernels.row_laws(
            rows, SamplingControls(), np.zeros(3, LAW_DTYPE), np.zeros((3, 5)), kernels.Workspace(5)
        )
    assert info.value.row == 2 and info.value.code == NONFINITE_LOGITS


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(laws_out=np.zeros((3, 4))), TypeError, "laws_out"),
        (dict(laws_out=np.zeros(2, LAW_DTYPE)), ValueError, "laws_out"),
        (dict(weights_out=np.zeros((3, 5), np.float32)), TypeError, "weights_out"),
        (dict(weights_out=np.zeros((3, 6))), ValueError, "weights_out"),
        (dict(rows=np.zeros(5)), ValueError, "rows"),
        (dict(rows=np.zeros((3, 5), np.int64)), TypeError, "rows"),
        (dict(controls=(1.0, 0, 1.0, 0.0)), TypeError, "controls"),
    ],
)
def test_row_laws_rejects_bad_arguments(kernels, change, error, match):
    args = dict(
        rows=np.zeros((3, 5)),
        controls=SamplingControls(),
        laws_out=np.zeros(3, LAW_DTYPE),
        weights_out=np.zeros((3, 5)),
        work=kernels.Workspace(5),
    )
    args.update(change)
    with pytest.raises(error, match=match):
        kernels.row_laws(**args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sample_token_same_result_for_any_layout_of_its_arrays(kernels, dtype, temperature):
    """The compiled core reads plain arrays (C-contiguous, aligned, native, LAW_DTYPE itself)
    directly and anything else through checked memoryviews: both give the same draw."""
    vocab = 700
    logits = (3.0 * np.random.default_rng(2).standard_normal(vocab)).astype(dtype)
    controls = SamplingControls(temperature)
    results = []
    for plain in (True, False):
        row = logits if plain else np.repeat(logits, 2)[::2].copy()  # a copy, read-only below
        if not plain:
            row.flags.writeable = False
        law_dtype = LAW_DTYPE if plain else np.dtype(LAW_DTYPE.descr)  # equal, not identical
        assert law_dtype == LAW_DTYPE
        law, weights = np.zeros(1, law_dtype), np.zeros(vocab, dtype=dtype)
        token = kernels.sample_token(
            row, controls, np.random.default_rng(9), law, weights, kernels.Workspace(vocab)
        )
        results.append((token, law.tobytes(), weights.tobytes()))
    assert results[0] == results[1]
