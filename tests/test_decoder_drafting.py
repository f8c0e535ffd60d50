"""Drafters in the decoder: exact law, greedy equality, adaptive length, stats, errors.

A deterministic drafter proposes one-hot drafts; the decoder keeps a drafted token x
with probability p(x) and on a rejection draws from p without x.  These tests check,
on both backends and both verification schemes, that the output law is the target's
exactly (enumeration and pooled chi-square, as in test_decoder_law.py), that greedy
decoding is the target's argmax decoding whatever the drafter, and that the
draft-length policy cannot change the law: it sees only what is known before the
target pass.

Power: ``test_power_rejects_keeping_every_one_hot_draft`` runs the same statistic, same
configuration and number of runs, on a decoder whose verify keeps every one-hot draft,
and requires p < POWER_ALPHA.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from law_models import ContextModel, enumerate_joint_law, new_tokens, pooled_chisquare

import specdec
from specdec._backend import kernels_for
from specdec.drafters import (
    Chain,
    Drafter,
    FixedDraftLength,
    PositionalDraftLength,
    PromptLookup,
    SuffixDrafter,
)

N_RUNS = 4_000
ALPHA = 1e-3
POWER_ALPHA = 1e-6
VOCAB = 5
PROMPT = [1, 3]
N_TOKENS = 4


class ContextDrafter(Drafter):
    """Proposes a context-dependent run of tokens: none after token 0, else
    ``(last * 2 + i) % V`` for i < 1 + last % 3.  Some proposals are likely under the
    target, some impossible, some absent: every branch of the one-hot verification
    runs."""

    def __init__(self):
        self.started = self.extended = 0

    def start(self, prompt):
        self.started += 1

    def propose(self, tokens, max_tokens):
        last = int(tokens[-1])
        if last == 0:
            return np.zeros(0, dtype=np.int64)
        n = min(max_tokens, 1 + last % 3)
        return np.array([(last * 2 + i) % VOCAB for i in range(n)], dtype=np.int64)

    def extend(self, tokens, n_new):
        self.extended += n_new


def target_model(dtype=np.float64):
    return ContextModel(VOCAB, seed=11, dtype=dtype)


def law_of(target, **controls):
    return enumerate_joint_law(target, PROMPT, N_TOKENS, **controls)


def outcomes(decoder, draft, target, seed, n_runs=N_RUNS):
    rng = np.random.default_rng(seed)
    counts = collections.Counter()
    for _ in range(n_runs):
        ids, _ = decoder.generate(draft, target, PROMPT, N_TOKENS, rng=rng)
        counts[new_tokens(ids, PROMPT, N_TOKENS)] += 1
    return counts


def check_exact(counts, law):
    result = pooled_chisquare(counts, law)
    assert result.impossible == 0, f"{result.impossible} outcomes of probability 0"
    assert result.pvalue > ALPHA, f"joint law differs from the target's: {result}"
    return result


# --- exact law ---------------------------------------------------------------------------

CONTROLS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.2, "top_p": 0.8, "min_p": 0.05},
]


#: Drafters of the law tests, with the draft length they run under: the context drafter
#: with ``gamma`` tokens per step, and the suffix drafter (its global tree fed by the
#: earlier runs' outputs) under the default policy, kept by the decoder across runs and
#: told that drafts are cheap (so that it drafts up to 3 tokens: 1.6k kept in 4k runs).
DRAFTERS = {
    "context-fixed": (ContextDrafter, lambda: "fixed"),
    "suffix-positional": (
        lambda: SuffixDrafter(max_depth=6, max_cached_requests=8),
        lambda: PositionalDraftLength(target_cost=[1.0, 1.05, 1.1, 1.15]),
    ),
}


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_one_hot_drafts_keep_the_targets_law(backend, verification, controls, drafter):
    target = target_model(np.float32)
    make_drafter, make_policy = DRAFTERS[drafter]
    decoder = specdec.SpeculativeDecoder(
        3, verification=verification, draft_length=make_policy(), backend=backend, **controls
    )
    counts = outcomes(decoder, make_drafter(), target, seed=21)
    check_exact(counts, law_of(target, **controls))


@pytest.mark.parametrize("verification", ["token", "block"])
def test_chain_of_drafter_and_model_keeps_the_law(backend, verification):
    """The drafter has no proposal after token 0: the draft model drafts then."""
    target = target_model()
    draft = ContextModel(VOCAB, seed=12, dtype=np.float32)
    decoder = specdec.SpeculativeDecoder(
        2, temperature=0.9, verification=verification, backend=backend
    )
    counts = outcomes(decoder, Chain(ContextDrafter(), draft), target, seed=22)
    check_exact(counts, law_of(target, temperature=0.9))


@pytest.mark.parametrize(
    "make_policy",
    [
        lambda: PositionalDraftLength(prior_acceptance=0.9, target_cost=(1.0, 1.1)),
        lambda: FixedDraftLength(),
        lambda: PositionalDraftLength(target_cost=[1.0, 1.1, 1.2, 1.3]),
        lambda: PositionalDraftLength(min_tokens=1, p_min=0.3),
    ],
    ids=["confident", "fixed", "positional", "positional-pmin"],
)
def test_draft_length_policies_keep_the_law(backend, make_policy):
    """A policy decides from earlier steps only, so any policy keeps the law; with a
    model draft, stopping at a low-confidence draft token (p_min) keeps it too."""
    target = target_model()
    draft = ContextModel(VOCAB, seed=13)
    decoder = specdec.SpeculativeDecoder(4, draft_length=make_policy(), backend=backend)
    check_exact(outcomes(decoder, Chain(ContextDrafter(), draft), target, seed=23), law_of(target))


def test_power_rejects_keeping_every_one_hot_draft(monkeypatch):
    """The statistic of the tests above rejects a verify that keeps every draft."""
    kernels = kernels_for(specdec.BACKEND)
    verify = kernels.verify

    def keep_everything(rows, drafted, weights, laws, bonus, *args):
        if weights is None and len(drafted):
            return len(drafted), -1
        return verify(rows, drafted, weights, laws, bonus, *args)

    monkeypatch.setattr(kernels, "verify", keep_everything)
    target = target_model(np.float32)
    decoder = specdec.SpeculativeDecoder(3, draft_length="fixed")
    result = pooled_chisquare(outcomes(decoder, ContextDrafter(), target, seed=21), law_of(target))
    assert result.pvalue < POWER_ALPHA, result


# --- greedy ------------------------------------------------------------------------------


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("draft_length", ["fixed", "adaptive"])
def test_greedy_with_a_drafter_is_the_targets_argmax_decoding(backend, verification, draft_length):
    target = target_model(np.float32)
    expected, _ = specdec.sample(target, PROMPT, 30, temperature=0.0, backend=backend)
    for draft in (ContextDrafter(), Chain(ContextDrafter(), ContextModel(VOCAB, seed=14))):
        decoder = specdec.SpeculativeDecoder(
            4, 0.0, verification=verification, draft_length=draft_length, backend=backend
        )
        ids, stats = decoder.generate(draft, target, PROMPT, 30)
        assert ids == expected
        # (an adaptive length may rightly draft nothing from these poor drafts)
        assert stats.total_draft_tokens_proposed > 0 or draft_length == "adaptive"


# --- the policy sees only the past ------------------------------------------------------


class Recorder:
    def __init__(self, events, model):
        self.events, self.model = events, model

    def forward(self, ids):
        self.events.append(("target", ids.shape[1]))
        return self.model.forward(ids)


class RecordingPolicy(PositionalDraftLength):
    def __init__(self, events):
        super().__init__()
        self.events = events

    def length(self, source, offered):
        n = super().length(source, offered)
        self.events.append(("length", n))
        return n

    def observe(self, source, drafted, kept, target_seconds, shadow):
        self.events.append(("observe", drafted))
        super().observe(source, drafted, kept, target_seconds, shadow)


def test_policy_decides_before_the_target_pass_and_learns_after(backend):
    """Per step: the drafter proposes, the policy picks a length, the target sees exactly
    the kept sequence plus that many drafts, and only then does the policy learn."""
    events = []

    class Always(Drafter):
        def propose(self, tokens, max_tokens):
            events.append(("propose", len(tokens)))
            return np.array(
                [(int(tokens[-1]) + 1 + i) % VOCAB for i in range(max_tokens)], dtype=np.int64
            )

    decoder = specdec.SpeculativeDecoder(4, draft_length=RecordingPolicy(events), backend=backend)
    ids, stats = decoder.generate(Always(), Recorder(events, target_model()), PROMPT, 20, rng=5)
    if events[-1] == ("target", len(PROMPT) + 19):  # one token left: nothing to draft
        events.pop()
        assert stats.num_target_forward_passes == len(events) // 4 + 1
    else:
        assert stats.num_target_forward_passes == len(events) // 4
    steps = [events[i : i + 4] for i in range(0, len(events), 4)]
    assert len(events) == 4 * len(steps)
    for (propose, length_before), (choose, n), (target, seen), (observe, drafted) in steps:
        assert (propose, choose, target, observe) == ("propose", "length", "target", "observe")
        assert seen == length_before + n and drafted == n


def test_adaptive_length_drafts_nothing_when_drafts_are_never_kept(backend):
    """A drafter whose tokens the target never allows: after a few steps the policy
    stops drafting, so the run costs about one target token per token."""

    class Hopeless(Drafter):
        def propose(self, tokens, max_tokens):
            return np.full(max_tokens, 4, dtype=np.int64)

    target = ContextModel(VOCAB, seed=15, masked=4)
    decoder = specdec.SpeculativeDecoder(8, backend=backend)
    ids, stats = decoder.generate(Hopeless(), target, PROMPT, 200, rng=1)
    assert stats.total_draft_tokens_accepted == 0
    assert stats.draft_length_histogram[0] > 0.9 * stats.num_target_forward_passes
    assert stats.total_draft_tokens_proposed < 20


def test_adaptive_length_drafts_long_when_drafts_are_always_kept(backend):
    """A drafter that knows the greedy continuation, and a target whose passes cost
    little per extra token (its ``cost_curve``): the policy drafts the maximum."""
    target = target_model()
    target.cost_curve = [1.0 + 0.1 * i for i in range(16)]
    expected, _ = specdec.sample(target, PROMPT, 120, temperature=0.0, backend=backend)

    class Oracle(Drafter):
        def propose(self, tokens, max_tokens):
            n = len(tokens)
            return np.asarray(expected[n : n + max_tokens], dtype=np.int64)

    decoder = specdec.SpeculativeDecoder(8, 0.0, backend=backend)
    ids, stats = decoder.generate(Oracle(), target, PROMPT, 120)
    assert ids == expected
    assert stats.acceptance_rate == 1.0
    # after a short ramp-up from the prior (acceptance 0.5), always the maximum
    assert stats.draft_length_histogram[8] >= 0.6 * stats.num_target_forward_passes


class RowCountingTarget:
    """A target that computes only the rows asked for (``logits_to_keep``) and counts them."""

    def __init__(self, model):
        self.model, self.rows = model, []
        self.vocab_size = model.vocab_size
        self.cost_curve = [1.0 + 0.1 * i for i in range(16)]  # drafts are cheap

    def forward(self, ids, logits_to_keep):
        self.rows.append(logits_to_keep)
        return self.model.forward(ids)[:, -logits_to_keep:]


@pytest.mark.parametrize("draft_length", ["fixed", "auto"])
@pytest.mark.parametrize("max_new_tokens", [1, 9, 23])
def test_a_drafter_asks_for_no_row_past_the_limit(backend, draft_length, max_new_tokens):
    """A pass gives at most its drafts plus one token: near ``max_new_tokens`` a drafter
    drafts one token fewer than are left, so that with every draft kept the target
    computes exactly one row per new token (drafting all that is left would compute a
    row whose token is cut)."""
    target = RowCountingTarget(target_model())
    expected, _ = specdec.sample(
        target.model, PROMPT, max_new_tokens, temperature=0.0, backend=backend
    )

    class Oracle(Drafter):
        def propose(self, tokens, max_tokens):
            n = len(tokens)
            return np.asarray(expected[n : n + max_tokens], dtype=np.int64)

    decoder = specdec.SpeculativeDecoder(4, 0.0, draft_length=draft_length, backend=backend)
    ids, stats = decoder.generate(Oracle(), target, PROMPT, max_new_tokens)
    assert ids == expected
    assert stats.total_draft_tokens_accepted == stats.total_draft_tokens_proposed
    assert sum(target.rows) == max_new_tokens, target.rows
    if draft_length == "fixed" and max_new_tokens == 9:
        assert target.rows == [5, 4]


def test_adaptive_policy_takes_the_shorter_of_near_ties_only_while_sampling(backend):
    """The decoder's own adaptive policy uses SAMPLING_TIE_TOLERANCE at a temperature
    above 0 and the best ratio (0) when greedy, following the live temperature and
    keeping what it learnt; a policy the caller passes is never changed."""
    from specdec._decoder import SAMPLING_TIE_TOLERANCE

    assert 0.0 < SAMPLING_TIE_TOLERANCE < 1.0
    target = target_model()
    decoder = specdec.SpeculativeDecoder(4, temperature=0.7, backend=backend)
    decoder.generate(ContextDrafter(), target, PROMPT, 20, rng=0)
    policy = decoder.draft_length_policy(ContextDrafter())  # the decoder's own ("auto")
    assert isinstance(policy, PositionalDraftLength)
    assert policy.tie_tolerance == SAMPLING_TIE_TOLERANCE
    decoder.temperature = 0.0
    decoder.generate(ContextDrafter(), target, PROMPT, 20, rng=0)
    assert decoder.draft_length_policy(ContextDrafter()) is policy
    assert policy.tie_tolerance == 0.0
    decoder.temperature = 1.0
    decoder.generate(ContextDrafter(), target, PROMPT, 20, rng=0)
    assert policy.tie_tolerance == SAMPLING_TIE_TOLERANCE
    # asking about other draft sources builds a policy the decoder does not keep
    other = decoder.draft_length_policy(PromptLookup())
    assert other is not policy and other.tie_tolerance == SAMPLING_TIE_TOLERANCE
    assert decoder.draft_length_policy(ContextDrafter()) is policy
    assert isinstance(decoder.draft_length_policy(target), FixedDraftLength)

    own = PositionalDraftLength(tie_tolerance=0.02)
    mine = specdec.SpeculativeDecoder(4, temperature=0.7, draft_length=own, backend=backend)
    mine.generate(ContextDrafter(), target, PROMPT, 20, rng=0)
    assert own.tie_tolerance == 0.02
    greedy = specdec.SpeculativeDecoder(4, temperature=0.0, draft_length=own, backend=backend)
    greedy.generate(ContextDrafter(), target, PROMPT, 20, rng=0)
    assert own.tie_tolerance == 0.02


# --- stats, drafter protocol, errors -----------------------------------------------------


def test_stats_of_a_chain(backend):
    drafter = ContextDrafter()
    decoder = specdec.SpeculativeDecoder(3, backend=backend)
    ids, stats = decoder.generate(
        Chain(drafter, ContextModel(VOCAB, seed=16)), target_model(), PROMPT, 60, rng=2
    )
    assert drafter.started == 1
    assert drafter.extended == stats.total_tokens_generated == len(ids) - len(PROMPT)
    assert sum(stats.draft_length_histogram) == stats.num_target_forward_passes
    assert (
        sum(n * c for n, c in enumerate(stats.draft_length_histogram))
        == stats.total_draft_tokens_proposed
    )
    by_source = stats.drafts_by_source
    assert set(by_source) <= {"ContextDrafter", "model"}
    assert sum(s["proposed"] for s in by_source.values()) == stats.total_draft_tokens_proposed
    assert sum(s["kept"] for s in by_source.values()) == stats.total_draft_tokens_accepted


@pytest.mark.parametrize(
    "proposal, error, match",
    [
        (np.array([7]), ValueError, "outside the target's vocabulary"),
        (np.array([-1]), ValueError, "negative"),
        (np.array([1.0]), TypeError, "int token ids"),
        (np.array([[1]]), TypeError, "1-D"),
        (np.arange(9) % VOCAB, ValueError, "more than max_tokens"),
    ],
)
def test_bad_proposals_are_clear_errors(backend, proposal, error, match):
    class Bad(Drafter):
        def propose(self, tokens, max_tokens):
            return proposal

    decoder = specdec.SpeculativeDecoder(4, draft_length="fixed", backend=backend)
    with pytest.raises(error, match=match):
        decoder.generate(Bad(), target_model(), PROMPT, 5, rng=0)


def test_chain_arguments():
    draft = ContextModel(VOCAB, seed=1)
    with pytest.raises(ValueError, match="last"):
        Chain(draft, ContextDrafter())
    with pytest.raises(ValueError, match="at most one"):
        Chain(draft, draft)
    with pytest.raises(TypeError, match="Chain source 0"):
        Chain(3)
    with pytest.raises(ValueError, match="at least one"):
        Chain()


# --- live attributes (the reference reads them at every call) -----------------------------


def test_attributes_are_read_at_every_call(backend):
    draft, target = ContextModel(VOCAB, seed=1), target_model()
    decoder = specdec.SpeculativeDecoder(2, backend=backend)
    greedy, _ = specdec.sample(target, PROMPT, 12, temperature=0.0, backend=backend)
    decoder.temperature = 0.0
    assert decoder.generate(draft, target, PROMPT, 12)[0] == greedy
    decoder.gamma = 5
    _, stats = decoder.generate(draft, target, PROMPT, 12)
    assert len(stats.accepted_length_histogram) == 6
    decoder.top_k = 1  # at temperature 1, top-1 is greedy too
    decoder.temperature = 1.0
    assert decoder.generate(draft, target, PROMPT, 12, rng=3)[0] == greedy
    assert "gamma=5" in repr(decoder) and "top_k=1" in repr(decoder)


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("gamma", 0, ValueError),
        ("gamma", 2.5, TypeError),
        ("temperature", -1.0, ValueError),
        ("temperature", "hot", TypeError),
        ("top_k", 0, ValueError),
        ("top_p", 1.5, ValueError),
        ("min_p", 1.0, ValueError),
        ("verification", "tree", ValueError),
        ("draft_length", "long", ValueError),
    ],
)
def test_setting_a_bad_attribute_is_refused_and_leaves_the_old_value(name, value, error):
    decoder = specdec.SpeculativeDecoder()
    before = getattr(decoder, name)
    with pytest.raises(error, match=name):
        setattr(decoder, name, value)
    assert getattr(decoder, name) == before
