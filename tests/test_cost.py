"""Cost curves (``specdec.drafters.cost``): checked where given, and following reality.

Every curve, wherever it is given, needs at least 2 points (the last tests).  The
rest is issue 29:

Under load, an adapter's one calibration measured a 2-token pass at 158 one-token
passes, and the policy never drafted again in that process.  Two defences, tested with
a model on a virtual clock that is slow only while it is being calibrated:

* an implausible calibration (a pass of k tokens dearer than ``1 + MARGIN`` times k
  one-token passes, or repeats spread beyond ``MAX_SPREAD``) is measured again, then
  replaced by the default curve, with one warning;
* during decoding the policy checks a measured curve against the passes it times
  (``drafters.cost.CurveCheck``) and corrects it when they disagree, so that a bad
  calibration costs a few steps, not the whole process.  A curve the user gave is
  taken as is (runs stay reproducible).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec import SpeculativeDecoder
from specdec.drafters import Drafter, PositionalDraftLength, PromptLookup, SuffixDrafter
from specdec.drafters.cost import AFTERMATH_PASSES, DEFAULT_COST_CURVE, CostCurve, CurveCheck
from specdec.models import _calibration
from specdec.models._cached import PrefixCachedModel

V = 6
PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


class VirtualClockModel(PrefixCachedModel):
    """ContextModel's logits behind the adapters' cache, its passes timed on a virtual
    clock: a pass over k new tokens costs ``1 + per_token * (k - 1)`` units when
    decoding, and ``calibration(k, round)`` while a calibration runs (a busy machine);
    with ``aftermath``, each of the AFTERMATH_PASSES passes after a pass over several
    tokens costs that much more while decoding (a machine slowed by batches)."""

    vocab_size = V

    def __init__(self, per_token=0.1, calibration=None, cost_curve=None, aftermath=0.0):
        super().__init__(cost_curve=cost_curve)
        self.aftermath = aftermath
        self.slowed = 0  # one-token passes still slowed by the last batch
        self.inner = ContextModel(V, seed=31, dtype=np.float32)
        self.per_token = per_token
        self.calibration = calibration
        self.calibrating = False
        self.calibrations = 0
        self.passes = 0  # timed passes in the current calibration
        self.clock = 0.0
        self._ids = np.zeros(0, dtype=np.int64)

    def _cached_ids(self):
        return self._ids

    def _first_to_evaluate(self, n_common, length, n_rows):
        return min(n_common, length - n_rows)

    def _roll_back(self, n_keep):
        self._ids = self._ids[:n_keep]

    def _evaluate(self, seq, start, n_rows):
        k = len(seq) - start
        if self.calibrating and self.calibration is not None:
            self.passes += 1
            self.clock += self.calibration(k, self.calibrations, self.passes)
        else:
            self.clock += 1.0 + self.per_token * (k - 1)
            if self.slowed:
                self.slowed -= 1
                self.clock += self.aftermath
            if k > 1:
                self.slowed = AFTERMATH_PASSES
        self._ids = np.array(seq, dtype=np.int64)
        return self.inner.forward(np.asarray(seq)[None])[:, -n_rows:]


@pytest.fixture
def virtual(monkeypatch):
    """Install a model's virtual clock as time.perf_counter; mark its calibrations."""
    rounds = _calibration._timed_rounds

    def timed_rounds(model, *args):
        model.calibrating, model.passes = True, 0
        model.calibrations += 1
        try:
            return rounds(model, *args)
        finally:
            model.calibrating = False

    monkeypatch.setattr(_calibration, "_timed_rounds", timed_rounds)

    def install(model):
        monkeypatch.setattr(time, "perf_counter", lambda: model.clock)
        return model

    return install


def _greedy(model, backend, n):
    reference = VirtualClockModel(cost_curve=[1.0, 1.1])
    return specdec.sample(reference, PROMPT, n, temperature=0.0, backend=backend)[0]


# -- (a) an implausible calibration is measured again, then replaced -------------------------


def _slow_batches(k, calibration, n):
    return 1.0 if k == 1 else 200.0 * k  # a 2-token pass "costs" 400 one-token passes


def test_an_implausible_curve_is_measured_again_then_replaced_with_one_warning(virtual):
    model = virtual(VirtualClockModel(calibration=_slow_batches))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        curve = model.cost_curve
    assert model.calibrations == _calibration.ATTEMPTS == 2
    assert curve.tolist() == list(DEFAULT_COST_CURVE)
    implausible = [w for w in caught if issubclass(w.category, _calibration.CalibrationWarning)]
    assert len(implausible) == 1 and "2 tokens" in str(implausible[0].message)
    assert model.cost_curve is curve  # kept: measured once per model


def _jittery_first(k, calibration, n):
    base = 1.0 + 0.5 * (k - 1)
    if calibration == 1:  # the first measurement: passes at random 6x slower
        return base * (6.0 if JITTER.random() < 0.5 else 1.0)
    return base


JITTER = np.random.default_rng(3)


def test_a_spread_calibration_is_measured_again_and_kept_when_calm(virtual, monkeypatch):
    monkeypatch.setattr(_calibration, "TIME_BUDGET", 1e9)  # every round, on the virtual clock
    model = virtual(VirtualClockModel(calibration=_jittery_first))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the second measurement is plausible
        curve = model.cost_curve
    assert model.calibrations == 2
    np.testing.assert_allclose(curve[:4], [1.0, 1.5, 2.0, 2.5])


@pytest.mark.parametrize(
    "curve, times, problem",
    [
        ([1.0, 1.9, 2.5], {}, None),
        ([1.0, 3.1, 3.2], {}, "2 tokens"),  # above 1.5 x 2
        ([1.0, 1.5, 4.6], {}, "3 tokens"),
        ([1.0, 1.5], {"a": [1.0, 1.1], "b": [1.0, 1.2]}, None),
        ([1.0, 1.5], {"a": [1.0, 3.0], "b": [1.0, 2.5], "c": [1.0, 1.1]}, "differ"),
    ],
)
def test_implausibility_states_its_bounds(curve, times, problem):
    found = _calibration.implausibility(np.array(curve), times)
    assert (found is None) if problem is None else (problem in found)


# -- (b) decoding corrects a wrong curve from its timed passes ------------------------------


def _pass_alone(k, calibration, n):
    return 1.0 + 0.1 * (k - 1)  # the pass's own time, without the slowdown after it


class NowAndThen(Drafter):
    """Proposes the target's own greedy continuation (all kept) at one position in 25."""

    def __init__(self, continuation):
        self.continuation = np.asarray(continuation, dtype=np.int64)

    def propose(self, tokens, max_tokens):
        if len(tokens) % 25:
            return np.zeros(0, dtype=np.int64)
        return self.continuation[len(tokens) : len(tokens) + min(max_tokens, 8)].copy()


def _decoded_with_slowdowns(virtual, backend):
    """A model whose batches slow the 6 passes after them by 0.5, after 300 greedy tokens
    drafted now and then (exact: the output is the target's greedy decoding)."""
    model = virtual(VirtualClockModel(calibration=_pass_alone, aftermath=0.5))
    expected = _greedy(model, backend, 300)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    ids, stats = decoder.generate(NowAndThen(expected), model, PROMPT, 300)
    assert ids == expected and stats.total_draft_tokens_proposed > 0
    return model


def test_the_slowdown_after_a_batch_is_charged_to_it_and_kept_by_the_model(virtual, backend):
    # A calibration that timed each pass alone: 1 + 0.1 n for n drafts.  Decoding pays
    # 3.0 more after each batch (its next 6 passes 0.5 slower): 8 drafts cost 4.7, and
    # drafting here (4 tokens, all kept, for 4.4) loses against plain decoding.
    model = _decoded_with_slowdowns(virtual, backend)
    calibrated = CostCurve.of_model(model)
    assert calibrated.drafts(8) == pytest.approx(1.8)
    fresh = PositionalDraftLength()  # a new policy (a new decoder) on the same model
    fresh.start(16, CostCurve.of_model(model))
    # kept by the adapter's check: the curve's extra cost over one token scaled by what
    # the timed passes showed (a constant slowdown per batch is charged to long drafts
    # in proportion: above the true 4.7 here)
    assert fresh.cost(8) > 4.7
    given = PositionalDraftLength(target_cost=calibrated.values)  # a curve given: as is
    given.start(16, CostCurve.of_model(model))
    assert given.cost(8) == pytest.approx(1.8)


def test_without_the_charge_the_check_accepts_the_calibration(virtual, backend, monkeypatch):
    # Power of the test above: a check that charges each pass its own time only (as
    # before) accepts the calibrated 1.8.
    monkeypatch.setattr("specdec.drafters.cost.AFTERMATH_PASSES", 0)
    model = _decoded_with_slowdowns(virtual, backend)
    fresh = PositionalDraftLength()
    fresh.start(16, CostCurve.of_model(model))
    assert fresh.cost(8) < 2.5


def _linear(k, calibration, n):
    return float(k)  # plausible (k passes for k tokens) but wrong: decoding costs 1.1 for 2


@pytest.mark.parametrize("check", [True, False])
def test_a_bad_calibration_costs_a_few_steps_not_the_run(virtual, monkeypatch, backend, check):
    if not check:  # what the policy did before: the curve as calibrated, for the whole run
        monkeypatch.setattr(CurveCheck, "curve", lambda self, base: base)
        monkeypatch.setattr(CurveCheck, "probe", lambda self: False)
    model = virtual(VirtualClockModel(per_token=0.1, calibration=_linear))
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    ids, stats = decoder.generate(PromptLookup(), model, PROMPT, 300)
    assert ids == _greedy(model, backend, 300)  # exact either way
    np.testing.assert_allclose(model.cost_curve[:3], [1.0, 2.0, 3.0])  # the bad curve
    if check:
        assert stats.tokens_per_step > 2.0  # drafting after a few probes
    else:
        assert stats.total_draft_tokens_proposed == 0  # drafting off for good


def test_the_correction_is_learnt_once_per_policy_across_calls(virtual, backend):
    model = virtual(VirtualClockModel(per_token=0.1, calibration=_linear))
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    decoder.generate(PromptLookup(), model, PROMPT, 80)
    # the next request drafts from its first steps: the policy kept the correction
    _, stats = decoder.generate(PromptLookup(), model, PROMPT, 12)
    assert stats.total_draft_tokens_accepted >= 6


def test_a_given_curve_is_never_corrected(virtual, backend):
    """The user's curve is theirs: no probes, no correction, reproducible runs."""
    model = virtual(VirtualClockModel(per_token=0.1, cost_curve=[1.0] + [9.0] * 15))
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    _, stats = decoder.generate(PromptLookup(), model, PROMPT, 100)
    assert stats.total_draft_tokens_proposed == 0


def test_curve_check_keeps_an_agreeing_curve_and_scales_a_wrong_one():
    base = CostCurve([1.0, 2.0, 3.0, 4.0])
    base.checkable = True
    check = CurveCheck()
    assert check.curve(base) is base

    def drafted_pass(seconds, after=1.0):
        check.record(1, seconds)
        for _ in range(AFTERMATH_PASSES):  # the passes it is charged for
            check.record(0, after)

    for _ in range(CurveCheck.SAMPLES):
        check.record(0, 1.0)  # steady one-token passes
    for _ in range(CurveCheck.SAMPLES):
        drafted_pass(1.8)  # 1.8 against 2.0: within the tolerance
    assert check.curve(base) is base and not check.probe()
    for _ in range(CurveCheck.WINDOW):
        drafted_pass(1.2)  # 1.2 against 2.0: off by more than 1.25x
    corrected = check.curve(base)
    assert corrected is not base
    np.testing.assert_allclose(corrected.values, [1.0, 1.2, 1.4, 1.6])
    for _ in range(CurveCheck.WINDOW):
        drafted_pass(1.2, after=1.3)  # the passes after it slowed: 1.2 + 6 x 0.3 = 3.0
    np.testing.assert_allclose(check.curve(base).values, [1.0, 3.0, 5.0, 7.0])
    given = CostCurve([1.0, 2.0])  # not checkable (a user's): as is
    assert check.curve(given) is given
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        check.record(1, bad)  # ignored


def test_curve_check_recomputes_after_a_drafted_pass_or_a_window_of_steady_ones(monkeypatch):
    """On open text nearly every pass is a steady one: recomputing the correction after
    each cost 20 us of a 5 ms token (and a new curve whose tables the policy rebuilt)."""
    base = CostCurve([1.0, 2.0, 3.0, 4.0])
    base.checkable = True
    check = CurveCheck()
    check.curve(base)
    computed = []
    correction = CurveCheck._correction
    monkeypatch.setattr(
        CurveCheck, "_correction", lambda self, b: computed.append(1) or correction(self, b)
    )
    for _ in range(CurveCheck.SAMPLES):
        check.record(0, 1.0)
    for _ in range(CurveCheck.SAMPLES):
        check.record(1, 1.2)  # off the curve: corrected
        for _ in range(AFTERMATH_PASSES):
            check.record(0, 1.0)
    corrected = check.curve(base)
    assert corrected is not base and len(computed) == 1
    for _ in range(CurveCheck.WINDOW - 1):
        check.record(0, 1.0)
        assert check.curve(base) is corrected  # kept: its tables too
    assert len(computed) == 1
    check.record(0, 1.0)  # a window of steady passes since: recomputed
    check.curve(base)
    assert len(computed) == 2
    check.record(1, 1.2)  # a drafted pass (charged once its aftermath is in)
    for _ in range(AFTERMATH_PASSES):
        check.record(0, 1.0)
    check.curve(base)
    assert len(computed) == 3


def test_only_a_curve_that_forbids_drafting_is_probed():
    """Probes cost a pass each on text where drafts are not kept: only a curve on which
    no draft could pay (which would otherwise never be timed) gets them."""
    permits = CostCurve([1.0, 1.6, 2.1, 2.6])  # llama.cpp on all cores, roughly
    forbids = CostCurve([1.0, 2.0, 3.0, 4.0])  # a draft always kept just breaks even
    probes = {}
    for name, base in (("permits", permits), ("forbids", forbids)):
        base.checkable = True
        check = CurveCheck()
        check.curve(base)
        probes[name] = sum(check.probe() for _ in range(4 * CurveCheck.PROBE_EVERY))
    assert probes == {"permits": 0, "forbids": 4}


# -- cost curves of fewer than 2 points --------------------------------------------------------


@pytest.mark.parametrize("curve", [[1.0], (1,), np.array([1.0]), []])
def test_curves_of_fewer_than_2_points_are_refused_everywhere(backend, curve):
    with pytest.raises((ValueError, TypeError), match="at least 2"):
        CostCurve(curve)
    with pytest.raises((ValueError, TypeError), match="target_cost"):
        PositionalDraftLength(target_cost=curve)
    with pytest.raises(ValueError, match="at least 2"):
        CostCurve([1.0, 2.0], tree=curve)

    class Target(ContextModel):
        cost_curve = curve

    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    with pytest.raises(ValueError, match="target_model.cost_curve"):
        decoder.generate(SuffixDrafter(), Target(6), [1, 2, 1, 2], 5)


def test_adapters_refuse_a_one_point_curve():
    from specdec.models import _calibration

    with pytest.raises(ValueError, match="at least 2"):
        _calibration.check_cost_curve([1.0])
    assert _calibration.check_cost_curve([1.0, 1.5]).tolist() == [1.0, 1.5]
