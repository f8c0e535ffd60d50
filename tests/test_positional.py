"""Draft-length policies: the cost curve, PositionalDraftLength's model and decisions, the
decoder keeping its policy across calls, and drafters not capped by the default gamma.

The law with these policies is tested in tests/test_decoder_drafting.py (they only choose how
many drafted tokens the target verifies, from what is known before its pass).
"""

from __future__ import annotations

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec.drafters import (
    CostCurve,
    Drafter,
    FixedDraftLength,
    PositionalDraftLength,
    PromptLookup,
)
from specdec.drafters.cost import DEFAULT_COST_CURVE

VOCAB = 5
PROMPT = [1, 3]

# --- the cost curve --------------------------------------------------------------------


def test_cost_curve_reads_and_extends():
    curve = CostCurve([1.0, 1.5, 1.75])
    assert [curve.tokens(t) for t in (1, 2, 3, 4, 6)] == [1.0, 1.5, 1.75, 2.0, 2.5]
    assert curve.drafts(0) == 1.0 and curve.drafts(2) == 1.75
    falling = CostCurve([1.0, 2.0, 1.5])  # extended flat, never downwards
    assert falling.tokens(3) == falling.tokens(9) == 1.5


class Target:
    def __init__(self, **attributes):
        self.reads = 0
        self._attributes = attributes

    def __getattr__(self, name):
        if name in self._attributes:
            self.reads += 1
            return self._attributes[name]
        raise AttributeError(name)


def test_model_curve_is_read_lazily():
    target = Target(cost_curve=np.array([1.0, 1.2]))
    curve = CostCurve.of_model(target)
    assert target.reads == 0  # a calibration would run on first use only
    assert curve.drafts(1) == 1.2 and curve.drafts(3) == pytest.approx(1.6)
    assert target.reads == 1
    curve.drafts(5)
    assert target.reads == 1
    assert CostCurve.of_model(object()).values == DEFAULT_COST_CURVE


def test_a_fixed_draft_length_never_reads_the_cost_curve(backend):
    class Calibrated(ContextModel):
        reads = 0

        @property
        def cost_curve(self):
            Calibrated.reads += 1
            return [1.0, 1.1]

    target = Calibrated(VOCAB, seed=1)
    draft = ContextModel(VOCAB, seed=2)
    specdec.SpeculativeDecoder(backend=backend).generate(draft, target, PROMPT, 5, rng=0)
    assert Calibrated.reads == 0
    decoder = specdec.SpeculativeDecoder(draft_length="adaptive", backend=backend)
    decoder.generate(draft, target, PROMPT, 5, rng=0)
    assert Calibrated.reads == 1


@pytest.mark.parametrize(
    "value, error, match",
    [
        (np.array([0.5, 0.3]), ValueError, r"target_cost\[0\] must be 1.0 .*got 0.5"),
        (np.array([[1.0, 2.0]]), ValueError, "target_cost .*shape"),
        ([1.0, -2.0], ValueError, "target_cost"),
        ([1.0, float("nan")], ValueError, "target_cost"),
        ([], ValueError, "target_cost"),
        ("measured", TypeError, "target_cost"),  # timed online: removed in 0.3
        ((0.5, -1.0), ValueError, "target_cost must be a cost curve"),  # a pair: removed
        (3.0, TypeError, "target_cost"),
        (["a", "b"], TypeError, "target_cost"),
    ],
)
def test_bad_target_cost_is_a_clear_error(value, error, match):
    """Issue 16 item 8: an array never reaches a truth-value test."""
    with pytest.raises(error, match=match):
        PositionalDraftLength(target_cost=value)


def test_target_cost_forms():
    assert PositionalDraftLength(target_cost=None).target_cost is None
    given = PositionalDraftLength(target_cost=(1.0, 1.1)).target_cost
    assert given.drafts(1) == 1.1 and not given.checkable  # the user's: taken as is
    assert PositionalDraftLength(target_cost=np.array([1.0, 1.1])).target_cost.drafts(1) == 1.1


# --- PositionalDraftLength ---------------------------------------------------------------


def test_priors_fit_copies_and_spurious_matches():
    policy = PositionalDraftLength()
    policy.start(16, CostCurve(DEFAULT_COST_CURVE))
    assert policy.length((0, 1), 16) == 0  # a 1-token match rarely pays
    assert policy.length((0, 16), 16) >= 6  # a copy does
    a = policy.acceptances((0, 2), 5)
    assert a == sorted(a)  # conditional acceptance rises along a match
    # the best ratio itself (no tolerance of near ties)
    flat = PositionalDraftLength(target_cost=[1.0, 1.02, 1.04], tie_tolerance=0.0)
    flat.start(16)
    assert flat.length((0, 1), 16) > 0  # ...unless extra tokens cost next to nothing
    assert flat.length((0, 16), 16) == 16


def _rates(policy, key, offered):
    """Every length's expected tokens per unit of cost, from the policy's estimates."""
    a = policy.acceptances(key, offered)
    rates, expected, survive = [], 1.0, 1.0
    for n in range(offered + 1):
        if n:
            survive *= a[n - 1]
            expected += survive
        rates.append(expected / (policy.cost(n) + policy.draft_cost * n))
    return rates


def test_near_ties_draft_the_shortest_while_the_cell_is_new():
    """A new cell: the shortest length within tie_tolerance of the best ratio; as the
    cell is observed the tolerance fades, and the best ratio is drafted."""
    policy = PositionalDraftLength(target_cost=[1.0, 1.02, 1.04], tie_tolerance=0.06)
    policy.start(16)
    rates = _rates(policy, (0, 16), 16)
    best = max(rates)
    shortest = next(n for n, r in enumerate(rates) if r >= (1 - policy.tie_tolerance) * best)
    assert policy.length((0, 16), 16) == shortest < rates.index(best) == 16
    for _ in range(200):  # a copy: every draft kept
        policy.observe((0, 16), 16, 16, 0.0, True)
    rates = _rates(policy, (0, 16), 16)
    tolerance = (
        policy.tie_tolerance
        * policy.prior_strength
        / (policy.prior_strength + policy._cells[policy._cell_key((0, 16), 1)].tested)
    )
    assert tolerance < 0.005  # memory 0.98 keeps at most 50 tokens' weight: 0.06 * 4 / 54
    assert policy.length((0, 16), 16) == rates.index(max(rates)) == 16


@pytest.mark.parametrize("tolerance", [-0.1, 1.0, float("nan"), "x", True])
def test_bad_tie_tolerance_is_a_clear_error(tolerance):
    with pytest.raises(ValueError, match=r"tie_tolerance must be a number in \[0, 1\)"):
        PositionalDraftLength(tie_tolerance=tolerance)


def test_evidence_learns_in_the_smallest_bucket_that_holds_it():
    policy = PositionalDraftLength()
    buckets = policy.EVIDENCE_BUCKETS
    for evidence in range(0, 2 * policy.MAX_EVIDENCE):
        expected = next((b for b in buckets if evidence <= b), policy.MAX_EVIDENCE)
        assert policy.cell_group((0, evidence)) == (0, expected)


@pytest.mark.parametrize("offset_rate", [0.0, 0.6])
def test_rejections_at_a_position_shorten_the_drafts(offset_rate):
    policy = PositionalDraftLength(target_cost=[1.0, 1.1, 1.2, 1.3], offset_rate=offset_rate)
    policy.start(16)
    key = (0, 8)
    initial = policy.length(key, 16)
    assert initial >= 8
    for _ in range(30):  # tokens 1 and 2 are kept, token 3 never is
        policy.observe(key, 5, 2, 0.0, None)
    assert policy.length(key, 16) == 2
    # Other evidence is another cell, whose prior at position 3 what this bucket saw
    # there lowers (the source's pooled tally), with or without the source's offset.
    assert policy.length((0, 9), 16) < initial
    assert (policy.offset(0) < 0.0) == (offset_rate > 0.0)
    assert policy.length((1, 9), 16) >= initial  # another source is untouched
    policy.reset()
    assert policy.offset(0) == 0.0
    assert policy.length(key, 16) == initial


def test_a_bucket_learns_from_the_sources_other_buckets_at_each_position():
    policy = PositionalDraftLength(offset_rate=0.0)  # the pooled tally alone
    fresh, seen = (0, 4), (0, 8)  # buckets 5 and 8
    before = policy.acceptances(fresh, 3)
    for _ in range(10):  # token 1 always kept, token 2 never
        policy.observe(seen, 3, 1, 0.0, None)
    after = policy.acceptances(fresh, 3)
    assert after[0] > before[0]  # position 1: kept elsewhere, raised
    assert after[1] < 0.5 < before[1]  # position 2: rejected elsewhere, lowered
    assert policy.acceptances((1, 4), 3) == before  # another source: untouched
    # the cell's own observations still weigh as before, on top of the pooled prior
    policy.observe(fresh, 2, 2, 0.0, None)
    assert policy.acceptances(fresh, 2)[1] > after[1]
    policy.reset()  # forgets the pooled tallies too
    assert policy.acceptances(fresh, 3) == before


def test_a_sources_offset_follows_the_text_before_each_cell_is_observed():
    """Failed drafts at some evidence lower the priors of every evidence of the source
    (open text), kept ones raise them (a copy); a draft model's source has no offset."""
    curve = [1.0, 1.6, 1.9, 2.2, 2.5, 2.8]
    failing, copying = (
        PositionalDraftLength(target_cost=curve),
        PositionalDraftLength(target_cost=curve),
    )
    for policy in (failing, copying):
        policy.start(16)
    prior_3 = failing.acceptance((0, 3))
    assert failing.length((0, 3), 16) > 0  # a 3-token match drafts on the prior
    for _ in range(6):
        failing.observe((0, 2), 1, 0, 0.0, None)  # 2-token matches: never kept
        failing.observe((0, 1), 0, 0, 0.0, False)  # 1-token: never right (shadow)
        copying.observe((0, 2), 2, 2, 0.0, True)  # kept, and the next token too
    assert failing.offset(0) < -1.0 < 1.0 < copying.offset(0)
    # the 3-token cell was never observed: only the offset moved its estimate
    assert failing.acceptance((0, 3)) < prior_3 < copying.acceptance((0, 3))
    assert failing.length((0, 3), 16) == 0
    low, high = PositionalDraftLength.OFFSET_BOUNDS
    for _ in range(200):
        failing.observe((0, 3), 1, 0, 0.0, None)
        copying.observe((0, 3), 3, 3, 0.0, True)
    assert failing.offset(0) == low and copying.offset(0) == high
    model = PositionalDraftLength()
    model.observe((1, None), 3, 0, 0.0, None)
    assert model.offset(1) == 0.0


@pytest.mark.parametrize("rate", [-0.1, float("inf"), "fast", True])
def test_bad_offset_rate_is_a_clear_error(rate):
    with pytest.raises(ValueError, match="offset_rate must be a finite number >= 0"):
        PositionalDraftLength(offset_rate=rate)


def test_shadow_observations_teach_the_next_position():
    policy = PositionalDraftLength()
    policy.start(16)
    key = (0, None)
    assert policy.length(key, 4) == 0
    for _ in range(20):  # never drafted, but the proposal's first token always matched
        policy.observe(key, 0, 0, 0.0, True)
    assert policy.acceptance(key, 1) > 0.9
    assert policy.length(key, 4) > 0


def test_only_sources_without_free_observations_are_probed():
    steep = PositionalDraftLength(target_cost=[1.0, 1.9, 2.8])  # a token costs 0.9 more
    steep.start(16)
    drafter, model = (0, 1), (1, None)  # a 1-token match, a draft model

    def lengths(key, shadow):
        chosen = []
        for _ in range(3 * steep.PROBE_EVERY):
            n = steep.length(key, 4)
            chosen.append(n)
            steep.observe(key, n, 0, 0.0, shadow if n == 0 else None)
        return chosen

    # A drafter's proposal is scored for free against the target's token (shadow) at
    # every step it is not drafted: a paid one-token probe would only cost time.
    assert lengths(drafter, False) == [0] * (3 * steep.PROBE_EVERY)
    # A draft model is scored only when drafted: tried with one token now and then.
    probes = lengths(model, None)
    assert probes.count(1) == 3 and probes.count(0) == 3 * steep.PROBE_EVERY - 3


def test_the_policy_is_a_function_of_its_call_history(backend):
    """What the policy sees is what is known before each target pass: replaying its
    calls (keys, offers, outcomes) to a fresh policy gives the same lengths."""
    calls = []

    class Recording(PositionalDraftLength):
        def length(self, key, offered):
            n = super().length(key, offered)
            calls.append(("length", key, offered, n))
            return n

        def observe(self, key, drafted, kept, seconds, shadow):
            calls.append(("observe", key, drafted, kept, shadow))
            super().observe(key, drafted, kept, seconds, shadow)

    target = ContextModel(VOCAB, seed=3)
    decoder = specdec.SpeculativeDecoder(draft_length=Recording(), backend=backend)
    for seed in range(3):
        decoder.generate(PromptLookup(), target, [1, 2, 3, 1, 2, 3, 1, 2], 40, rng=seed)
    replay = PositionalDraftLength()
    replay.start(10, CostCurve.of_model(target))
    for call in calls:
        if call[0] == "length":
            assert replay.length(call[1], call[2]) == call[3]
        else:
            replay.observe(call[1], call[2], call[3], 0.0, call[4])
    assert any(call[0] == "length" and call[3] > 0 for call in calls)


# --- the decoder keeps its policy; drafters are not capped by the default gamma ----------


class Hopeless(Drafter):
    """Proposes a token the target never allows."""

    num_tokens = 8

    def propose(self, tokens, max_tokens):
        return np.full(max_tokens, 4, dtype=np.int64)


def test_the_decoder_keeps_what_its_policy_learnt_until_reset(backend):
    target = ContextModel(VOCAB, seed=15, masked=4)
    target.cost_curve = [1.0 + 0.05 * i for i in range(16)]  # drafts look cheap at first
    decoder = specdec.SpeculativeDecoder(backend=backend)

    def drafted():
        _, stats = decoder.generate(Hopeless(), target, PROMPT, 60, rng=1)
        return stats.total_draft_tokens_proposed

    first = drafted()
    assert first > 0
    assert drafted() < first  # it remembers that these drafts are never kept
    decoder.reset()
    assert drafted() == first


def test_runs_are_reproducible_given_seed_curve_and_history(backend):
    target = ContextModel(VOCAB, seed=4)

    def history():
        decoder = specdec.SpeculativeDecoder(seed=7, backend=backend)
        return [
            decoder.generate(PromptLookup(), target, [1, 2, 3, 1, 2], 30)[1].draft_length_histogram
            for _ in range(3)
        ]

    assert history() == history()


def test_drafters_are_capped_by_their_own_num_tokens_unless_gamma_is_set(backend):
    target = ContextModel(VOCAB, seed=5)
    draft = ContextModel(VOCAB, seed=6)
    default = specdec.SpeculativeDecoder(draft_length="fixed", backend=backend)
    assert default.gamma is None and "gamma=None" in repr(default)  # the sources' own
    _, stats = default.generate(Hopeless(), target, PROMPT, 20, rng=0)
    assert len(stats.draft_length_histogram) == 9 and stats.draft_length_histogram[8] > 0
    _, stats = default.generate(PromptLookup(num_tokens=6), target, [1, 2] * 8, 20, rng=0)
    assert len(stats.draft_length_histogram) == 7
    _, stats = default.generate(draft, target, PROMPT, 20, rng=0)
    assert len(stats.draft_length_histogram) == 5  # a draft model: the reference's 4
    explicit = specdec.SpeculativeDecoder(4, draft_length="fixed", backend=backend)
    _, stats = explicit.generate(Hopeless(), target, PROMPT, 20, rng=0)
    assert len(stats.draft_length_histogram) == 5
    default.gamma = 4  # setting it caps the drafters too
    _, stats = default.generate(Hopeless(), target, PROMPT, 20, rng=0)
    assert len(stats.draft_length_histogram) == 5


def test_fixed_policy_still_drafts_gamma_with_a_draft_model(backend):
    policy = FixedDraftLength()
    policy.start(4)
    assert policy.length((0, None), 10) == 4


@pytest.mark.parametrize("tie_tolerance", [0.0, 0.06, 0.3])
def test_length_stops_early_but_answers_as_the_full_search(tie_tolerance):
    """length() stops once no longer draft can pay; its answer is the full search's
    (with a tolerance of near ties: the shortest length within it of the best)."""
    import random

    def full_search(policy, key, offered):
        offered = min(offered, policy._max)
        rates = _rates(policy, key, offered)
        allowed = [n for n in range(offered + 1) if n >= policy.min_tokens]
        if not allowed:
            return 0
        best_n = max(allowed, key=lambda n: (rates[n], -n))
        cell = policy._cells.get(policy._cell_key(key, 1))
        strength = policy.prior_strength
        tolerance = tie_tolerance * strength / (strength + (cell.tested if cell else 0.0))
        return next(n for n in allowed if rates[n] >= (1.0 - tolerance) * rates[best_n])

    rng = random.Random(5)
    checked = 0
    for _ in range(300):
        curve = [1.0] + [rng.uniform(1.0, 1.0 + 0.8 * i) for i in range(1, rng.randint(2, 17))]
        if rng.random() < 0.5:
            curve = list(np.maximum.accumulate(curve))  # measured curves never decrease
        policy = PositionalDraftLength(
            min_tokens=rng.choice([0, 0, 1, 3]),
            target_cost=curve,
            draft_cost=rng.choice([0.0, 0.0, 0.05]),
            tie_tolerance=tie_tolerance,
        )
        policy.start(rng.randint(1, 24))
        for _ in range(rng.randint(0, 30)):  # some history
            key = (rng.randint(0, 1), rng.choice([None, 1, 2, 3, 8, 20]))
            drafted = rng.randint(0, 6)
            policy.observe(key, drafted, rng.randint(0, drafted), 0.0, rng.random() < 0.5)
        for evidence in (None, 1, 2, 3, 5, 12, 32):
            key, offered = (rng.randint(0, 1), evidence), rng.randint(1, 24)
            policy._idle.clear()  # no probe: compare the searches alone
            assert policy.length(key, offered) == full_search(policy, key, offered)
            checked += 1
    assert checked == 2100
