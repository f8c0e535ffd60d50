"""One drafter, one policy, one decoder shared by 8 threads (issue 29).

A server's thread pool shares one decoder and one drafter, so that a ``SuffixDrafter``'s
global tree learns from every request.  Each drafter keeps the request's state per
thread and guards what it shares with a lock (``drafters/_threads.py``): every thread's
greedy output must be the target's own greedy decoding, no call may raise, and the
shared ``SuffixDrafter`` must still learn from the outputs of earlier requests.  Before
the fix, a shared ``SuffixDrafter`` raised ``IndexError`` in most concurrent calls.
"""

from __future__ import annotations

import copy
import pickle
import sys
import threading

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec.drafters import (
    Chain,
    FixedDraftLength,
    NGram,
    PositionalDraftLength,
    PromptLookup,
    SuffixDrafter,
)
from specdec.drafters.cost import CostCurve, CurveCheck

THREADS = 8
ROUNDS = 3
NEW_TOKENS = 40


@pytest.fixture(autouse=True)
def frequent_switches():
    """Switch threads every microsecond, so that unguarded state is torn for sure."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


DRAFTERS = {
    "lookup": PromptLookup,
    "ngram": lambda: NGram(order=3),
    "suffix": SuffixDrafter,
    "chain": lambda: Chain(SuffixDrafter(), PromptLookup(), NGram(order=3)),
}


def _prompts():
    rng = np.random.default_rng(5)
    # repetitive prompts (drafts are proposed and kept), each thread its own
    return [np.tile(rng.integers(0, 6, size=5), 4).tolist() for _ in range(THREADS)]


def _run_threads(work):
    errors, results = [], [None] * THREADS
    start = threading.Barrier(THREADS)

    def run(i):
        try:
            start.wait()
            results[i] = work(i)
        except BaseException as error:  # reported below, with its thread
            errors.append((i, repr(error)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results


@pytest.mark.parametrize("name", sorted(DRAFTERS))
@pytest.mark.parametrize("policy", ["auto", "positional", "fixed"])
def test_one_drafter_and_decoder_serve_8_threads_exactly(backend, name, policy):
    target = ContextModel(6, seed=31, dtype=np.float32)
    drafter = DRAFTERS[name]()
    draft_length = {
        "auto": "auto",
        "positional": PositionalDraftLength(),
        "fixed": FixedDraftLength(),
    }[policy]
    decoder = specdec.SpeculativeDecoder(
        temperature=0.0, backend=backend, draft_length=draft_length
    )
    prompts = _prompts()
    expected = [
        specdec.sample(target, p, NEW_TOKENS, temperature=0.0, backend=backend)[0] for p in prompts
    ]

    def work(i):
        outputs = []
        for _ in range(ROUNDS):
            ids, stats = decoder.generate(drafter, target, prompts[i], NEW_TOKENS)
            outputs.append((ids, stats.total_draft_tokens_accepted))
        return outputs

    results = _run_threads(work)
    for i, outputs in enumerate(results):
        for ids, _ in outputs:
            assert ids == expected[i], f"thread {i}"
    assert sum(kept for outputs in results for _, kept in outputs) > 0
    if name == "suffix":
        # every thread's earlier outputs joined the shared global tree
        assert drafter.cached_requests == min(THREADS * (ROUNDS - 1), 64)


def test_shared_suffix_drafter_drafts_from_other_threads_outputs(backend):
    """The global tree learns across threads: a thread drafts from another's output."""
    target = ContextModel(6, seed=31, dtype=np.float32)
    drafter = SuffixDrafter()
    decoder = specdec.SpeculativeDecoder(temperature=0.0, backend=backend)
    prompt = [1, 2]
    first = threading.Thread(
        target=lambda: [decoder.generate(drafter, target, prompt, 40) for _ in range(2)]
    )
    first.start()
    first.join()  # its first output was committed when it started its second request
    assert drafter.cached_requests == 1
    drafter.start(np.array(prompt))  # this thread: matches the other thread's output
    proposal = drafter.propose(np.array(prompt), 8)
    assert len(proposal) > 0 and drafter.last_tree == "global"


class _MeasuredTarget:
    """A target whose adapter measured its curve and keeps the check of its passes."""

    def __init__(self):
        self.cost_curve = [1.0, 1.2, 1.4]
        self.cost_curve_measured = True
        self.cost_check = CurveCheck()


def test_a_shared_policy_corrects_each_threads_curve_by_its_own_targets_passes():
    a, b = _MeasuredTarget(), _MeasuredTarget()
    policy = PositionalDraftLength()
    policy.start(4, CostCurve.of_model(a))
    assert policy.cost(1) == 1.2
    for _ in range(8):  # a's passes: a one-token draft costs 3 one-token passes, not 1.2
        a.cost_check.record(1, 0.03)
        for _ in range(9):  # six charged to the draft (its aftermath), then steady ones
            a.cost_check.record(0, 0.01)
    assert policy.cost(1) == pytest.approx(3.0)
    seen = []
    other = threading.Thread(
        target=lambda: (policy.start(4, CostCurve.of_model(b)), seen.append(policy.cost(1)))
    )
    other.start()
    other.join()
    # b's thread uses b's check (nothing recorded: its curve as measured); this thread
    # still a's (it used to take the check of whichever thread started last)
    assert seen == [1.2] and policy.cost(1) == pytest.approx(3.0)


def test_per_thread_state_is_each_threads_own():
    drafter = PromptLookup()
    drafter.propose(np.array([1, 2, 3, 1, 2]), 4)
    assert drafter.last_match_size == 2
    seen = []
    thread = threading.Thread(target=lambda: seen.append(drafter.last_match_size))
    thread.start()
    thread.join()
    assert seen == [0] and drafter.last_match_size == 2


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_shared_drafters_still_copy_and_pickle(name):
    drafter = DRAFTERS[name]()
    drafter.start(np.array([1, 2, 3, 1, 2]))
    drafter.propose(np.array([1, 2, 3, 1, 2]), 4)
    for clone in (copy.deepcopy(drafter), pickle.loads(pickle.dumps(drafter))):
        assert type(clone) is type(drafter)
        clone.start(np.array([1, 2, 3, 1, 2]))
        assert len(clone.propose(np.array([1, 2, 3, 1, 2]), 4)) > 0
    policy = PositionalDraftLength()
    policy.start(4)
    assert type(pickle.loads(pickle.dumps(policy))) is PositionalDraftLength
