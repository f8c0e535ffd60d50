"""Cost of a drafting step (``propose`` + ``extend``) on a 4,000-token sequence.

The sequence is Python source from the standard library, byte-level tokens
(``specdec.toymodels.byte_corpus.encode``): text with the repeats (identifiers, idioms) that lookup
drafters live on.  All but its last ``GENERATED`` tokens are the prompt; the rest is
"generated" as a decoder with a greedy target would: each step proposes up to
``MAX_TOKENS`` tokens, keeps the prefix that agrees with the sequence plus one token
of the target, and shows the kept tokens to ``extend``.  A pytest-benchmark round
is the whole run from the end of the prompt to the end of the sequence; ``start``
(and, for the trained n-gram drafter, ``fit``) happen in the untimed setup.  The
timed loop includes the simulated verification (``none``, a drafter that never
proposes, shows that floor).

Cells:

* ``PromptLookup``: the incremental index (3- to 1-grams; proposals of at most
  ``MAX_TOKENS``, as every cell);
* ``SuffixDrafter``: suffix trees with counts over the sequence (defaults: depth 24);
  its step costs ``O(max_depth)`` per token, more than the index's but also independent
  of the length (issue 15 asks under 2% of a SmolLM2 step, 7 ms here, at 8,000 tokens);
* ``scan``: the same lookup by a vectorised NumPy scan of the whole sequence on
  every step (what an index avoids: its cost grows with the length);
* ``NGram-online``: ``NGram(order=4)`` learning only from the sequence itself;
* ``NGram-trained``: the same, first fitted on 200,000 other stdlib bytes;
* ``none``: no proposal at all (the harness's own cost per step);
* ``PromptLookup``, ``SuffixDrafter`` and ``scan`` again on a 16,000-token sequence (the
  same 3,000 generated tokens after a longer prompt): the index's and the trees' steps do
  not grow with the length, the scan's does.

``extra_info`` holds ``us_per_step`` (median over the rounds, ``_min`` the
minimum), the number of steps, the mean proposal length and the mean number of
tokens kept per step.  Speed is measured, never asserted.

Run::

    PYTHONPATH=src python3 -m pytest bench/bench_drafters.py --benchmark-only
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from specdec.drafters import NGram, PromptLookup, SuffixDrafter
from specdec.toymodels import byte_corpus as ngram

LENGTH = 4_000
LONG = 16_000
GENERATED = 3_000
MAX_TOKENS = 10
TRAIN_BYTES = 200_000


@pytest.fixture(scope="module")
def corpus():
    """(the 4,000-token sequence, 200,000 further bytes to train on)."""
    text = ngram.training_corpus(TRAIN_BYTES + 2 * LONG)
    sequence = np.frombuffer(text[:LONG], dtype=np.uint8).astype(np.int64)
    return sequence, [ngram.encode(text[LONG:].decode("utf-8", errors="replace"))]


class NoDraft:
    """Never proposes: what the benchmark loop itself costs per step."""

    def start(self, prompt):
        pass

    def extend(self, tokens, n_new):
        pass

    def propose(self, tokens, max_tokens):
        return np.zeros(0, dtype=np.int64)


class ScanLookup:
    """Prompt lookup without an index: one vectorised scan per n-gram size per step."""

    def __init__(self, num_tokens=10, max_ngram_size=3, min_ngram_size=1):
        self.num_tokens, self.max_n, self.min_n = num_tokens, max_ngram_size, min_ngram_size

    def start(self, prompt):
        pass

    def extend(self, tokens, n_new):
        pass

    def propose(self, tokens, max_tokens):
        length = tokens.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # Windows starting at 0 .. length - n - 1: every n-gram but the trailing one.
            windows = sliding_window_view(tokens[: length - 1], n)
            hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
            if hits.size:
                begin = int(hits[-1]) + n
                return tokens[begin : min(begin + min(self.num_tokens, max_tokens), length)].copy()
        return np.zeros(0, dtype=np.int64)


def _run(drafter, sequence):
    """Decode the sequence's last GENERATED tokens with *drafter*: (steps, proposed)."""
    total = sequence.shape[0]
    truth = sequence.tolist()
    length, steps, proposed = total - GENERATED, 0, 0
    while length < total:
        tokens = sequence[:length]
        proposal = drafter.propose(tokens, MAX_TOKENS)
        kept = 0
        for token in proposal.tolist():
            if length + kept >= total or token != truth[length + kept]:
                break
            kept += 1
        n_new = min(kept + 1, total - length)
        length += n_new
        drafter.extend(sequence[:length], n_new)
        steps += 1
        proposed += proposal.size
    return steps, proposed


DRAFTERS = {
    "PromptLookup": lambda train: PromptLookup(),
    "SuffixDrafter": lambda train: SuffixDrafter(),
    "scan": lambda train: ScanLookup(),
    "NGram-online": lambda train: NGram(order=4),
    "NGram-trained": lambda train: NGram(order=4).fit(train),
    "none": lambda train: NoDraft(),
}

CELLS = [pytest.param(name, LENGTH, id=f"{name}-L{LENGTH}") for name in DRAFTERS] + [
    pytest.param(name, LONG, id=f"{name}-L{LONG}")
    for name in ("PromptLookup", "SuffixDrafter", "scan")
]


@pytest.mark.parametrize(("name", "length"), CELLS)
def test_drafter_step(benchmark, corpus, name, length):
    sequence, train = corpus
    sequence = sequence[:length].copy()
    sequence.flags.writeable = False  # as the decoder hands it over
    benchmark.group = f"drafters: propose + extend, {length}-token sequence"
    results = []

    def setup():
        drafter = DRAFTERS[name](train)
        drafter.start(sequence[: length - GENERATED])
        return (drafter,), {}

    def once(drafter):
        results.append(_run(drafter, sequence))

    rounds = 3 if name == "NGram-trained" or (name == "scan" and length > LENGTH) else 7
    benchmark.pedantic(once, setup=setup, rounds=rounds, warmup_rounds=1)
    steps, proposed = results[-1]
    times = benchmark.stats.stats.data
    benchmark.extra_info.update(
        {
            "kind": "drafter",
            "drafter": name,
            "length": length,
            "prompt_tokens": length - GENERATED,
            "steps": steps,
            "mean_proposal": proposed / steps,
            "tokens_per_step": GENERATED / steps,
            "us_per_step": statistics.median(times) / steps * 1e6,
            "us_per_step_min": min(times) / steps * 1e6,
        }
    )
