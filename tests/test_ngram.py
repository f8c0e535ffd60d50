"""The NGram drafter (``specdec.drafters.ngram``): saving while it learns, bounded memory.

Regression tests of issue 16 (each failed before its fix); the matching rules are in
``test_drafters.py``.
"""

from __future__ import annotations

import copy
import pickle
import sys
import threading

import numpy as np
import pytest

from specdec.drafters import NGram

# -- NGram: saving while another thread learns (item 10) -----------------------------------


@pytest.mark.parametrize("operation", ["save", "deepcopy", "pickle"])
def test_ngram_save_while_another_thread_learns(tmp_path, operation):
    # Deterministic interleaving: at each C call save makes, the main thread lets the
    # learner thread run one update (new n-grams) and waits for it.  Before the fix,
    # an update in the middle of save's loop over the counts broke it ("dictionary
    # changed size during iteration").  With the lock, the learner waits for save's
    # copy, the wait below times out once, and both finish.
    drafter = NGram(order=3).fit([list(range(50))])
    before = drafter.num_grams
    go, done, errors = threading.Event(), threading.Event(), []
    stopping = False

    def learner():
        token = 1000
        while True:
            go.wait()
            go.clear()
            if stopping:
                return
            try:
                drafter.extend(np.array([token, token + 1, token + 2]), 3)
            except Exception as error:  # pragma: no cover - reported below
                errors.append(error)
            token += 3
            done.set()

    blocked = False

    def hook(frame, event, arg):
        nonlocal blocked
        if event == "c_call" and not blocked:
            done.clear()
            go.set()
            blocked = not done.wait(2.0)  # the learner waits for the lock that save holds

    thread = threading.Thread(target=learner)
    thread.start()
    sys.setprofile(hook)
    try:
        if operation == "save":
            drafter.save(tmp_path / "saved.npz")
        elif operation == "deepcopy":
            copied = copy.deepcopy(drafter)
        else:
            pickled = pickle.dumps(drafter)
    finally:
        sys.setprofile(None)
        done.wait(10.0)
        stopping = True
        go.set()
        thread.join(10.0)
    assert blocked and not errors and not thread.is_alive()
    if operation == "save":
        copied = NGram.load(tmp_path / "saved.npz")
    elif operation == "pickle":
        copied = pickle.loads(pickled)
    assert before <= copied.num_grams < drafter.num_grams


# -- NGram: bounded memory, with a documented eviction rule (item 11) -----------------------


def test_ngram_forgets_the_least_seen_contexts_first():
    drafter = NGram(order=2, max_grams=4, min_probability=0)
    drafter.fit([[1, 2, 1, 2, 1, 2]])  # contexts (1,) seen 3 times, (2,) twice
    drafter.fit([[5, 6]])
    drafter.fit([[7, 8]])
    assert drafter.num_grams == 4
    # A fifth n-gram: contexts go, least seen first and, among equals, the first seen
    # first, down to 3/4 of max_grams: (5,) and (7,) go.
    drafter.fit([[9, 10]])
    assert drafter.num_grams == 3
    assert [len(drafter.propose(np.array([token]), 1)) for token in (5, 7, 9, 1, 2)] == [
        0,
        0,
        1,
        1,
        1,
    ]


def test_ngram_memory_is_bounded_online():
    drafter = NGram(order=4, max_grams=500)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1000, 8)
    drafter.start(tokens)
    for _ in range(300):  # random text: about 3 new n-grams per token
        tokens = np.concatenate([tokens, rng.integers(0, 1000, 4)])
        drafter.extend(tokens, 4)
        assert drafter.num_grams <= 500
    assert drafter.max_grams == 500
    # New n-grams of one context count too.
    one_context = NGram(order=2, max_grams=10).fit([[1, token] for token in range(2, 100)])
    assert one_context.num_grams <= 10
    assert NGram(max_grams=None).max_grams is None
    with pytest.raises(ValueError, match="max_grams must be an int >= 1, got 0"):
        NGram(max_grams=0)
