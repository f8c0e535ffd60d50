"""Tiny context-dependent models, exact enumeration of their laws, and the test statistic.

A ``ContextModel``'s logits at position i depend on the tokens at i-1 and i and on
i itself, so the law of the next token changes with the context: a sampler that
used the wrong row, or ignored the context, draws from the wrong law.

``pooled_chisquare`` compares sampled outcomes with an exact law from
``enumerate_joint_law``: Pearson's chi-square, cells with expectation < 5 pooled into
one (the law tests' statistic; README.md, "Guarantees").
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as _stats


class ContextModel:
    """Logits = table[previous token, current token, position % period].

    Parameters
    ----------
    vocab_size : int
        Number of tokens V.
    seed : int
        Seed of the random table.
    scale : float
        Spread of the logits (larger: more peaked laws).
    dtype : numpy dtype
        float32 or float64.
    period : int
        Positions repeat with this period.
    masked : int or sequence of int, optional
        These token ids get -inf everywhere (never possible).
    integer : bool
        Round the logits to integers, so that rows hold ties (at the maximum, at a
        top-k boundary, inside a top-p set).
    """

    def __init__(
        self,
        vocab_size=5,
        seed=0,
        scale=1.5,
        dtype=np.float64,
        period=3,
        masked=None,
        integer=False,
    ):
        rng = np.random.default_rng(seed)
        # previous token index V stands for "no previous token"
        table = scale * rng.standard_normal((vocab_size + 1, vocab_size, period, vocab_size))
        if integer:
            table = np.round(table)
        self.table = table.astype(dtype)
        if masked is not None:
            self.table[..., masked] = -np.inf
        self.vocab_size = vocab_size
        self.period = period
        self.calls = 0

    def forward(self, ids):
        self.calls += 1
        ids = np.asarray(ids)[0]
        previous = np.concatenate(([self.vocab_size], ids[:-1]))
        positions = np.arange(len(ids)) % self.period
        return self.table[previous, ids, positions][np.newaxis]

    def next_logits(self, sequence):
        """Logits for the token after ``sequence`` (a list of ids)."""
        previous = sequence[-2] if len(sequence) > 1 else self.vocab_size
        return self.table[previous, sequence[-1], (len(sequence) - 1) % self.period].astype(
            np.float64
        )


class SparseVocabModel:
    """A ``ContextModel`` over a few live token ids of a large vocabulary.

    Every other id has logit -inf, so the exact law still enumerates quickly, while
    the kernels work on rows of ``vocab_size`` logits -- more than one block of
    ``specdec._common.BLOCK_SIZE`` when ``vocab_size`` is large, with the live ids
    spread over several blocks (and whole blocks of -inf between them).

    Parameters
    ----------
    vocab_size : int
        Number of token ids V.
    live : sequence of int
        The ids that can have positive probability (prompt ids must be among them).
    **kwargs
        Passed to ``ContextModel`` (seed, scale, dtype, integer...).
    """

    def __init__(self, vocab_size, live, **kwargs):
        self.live = np.asarray(live, dtype=np.int64)
        self.inner = ContextModel(len(self.live), **kwargs)
        self.vocab_size = vocab_size
        self.index = np.full(vocab_size, -1, dtype=np.int64)
        self.index[self.live] = np.arange(len(self.live))
        self.calls = 0

    def _inner_ids(self, ids):
        inner = self.index[np.asarray(ids, dtype=np.int64)]
        if np.any(inner < 0):
            raise ValueError("a token outside the live ids was fed to SparseVocabModel")
        return inner

    def forward(self, ids):
        self.calls += 1
        small = self.inner.forward(
            self._inner_ids(ids)[np.newaxis] if np.ndim(ids) == 1 else self._inner_ids(ids)
        )
        out = np.full(small.shape[:2] + (self.vocab_size,), -np.inf, dtype=small.dtype)
        out[..., self.live] = small
        return out

    def next_logits(self, sequence):
        small = self.inner.next_logits([int(i) for i in self._inner_ids(sequence)])
        out = np.full(self.vocab_size, -np.inf)
        out[self.live] = small
        return out


def warped_probs(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The law the decoder must reproduce: temperature, top-k, top-p, min-p, renormalise.

    Written independently of the kernels (a sort, not a selection), as the oracle.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        probs = np.zeros_like(logits)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    z = (logits - logits.max()) / temperature
    w = np.exp(z)
    keep = np.isfinite(logits)
    if top_k is not None and top_k < len(logits):
        kth = np.sort(logits)[-top_k]
        keep &= logits >= kth
    if top_p is not None and top_p < 1.0:
        wk = np.where(keep, w, 0.0)
        order = np.argsort(-logits, kind="stable")
        cumulative = np.cumsum(wk[order]) / wk.sum()
        cut = logits[order][np.searchsorted(cumulative, top_p - 1e-12)]
        keep &= logits >= cut
    if min_p is not None and min_p > 0:
        keep &= w >= min_p  # w of the max is 1
    w = np.where(keep, w, 0.0)
    return w / w.sum()


def enumerate_joint_law(model, prompt, n_tokens, eos_token_id=None, **controls):
    """Exact law of the first ``n_tokens`` new tokens (shorter outcomes end at EOS).

    Returns
    -------
    dict
        Maps a tuple of new token ids to its probability.
    """
    law = {}

    def extend(sequence, prefix, prob):
        if len(prefix) == n_tokens or (
            prefix and eos_token_id is not None and prefix[-1] == eos_token_id
        ):
            law[tuple(prefix)] = law.get(tuple(prefix), 0.0) + prob
            return
        probs = warped_probs(model.next_logits(sequence), **controls)
        for token in np.flatnonzero(probs):
            extend(sequence + [int(token)], prefix + [int(token)], prob * probs[token])

    extend(list(prompt), [], 1.0)
    return law


def reachable_rows(model, prompt, n_tokens, eos_token_id=None, **controls):
    """Every context the enumeration of ``enumerate_joint_law`` visits, with its logits.

    Yields ``(sequence, logits)`` for each sequence (prompt + new tokens) of positive
    probability under the warped law whose next token is still part of the first
    ``n_tokens``; used to check that a configuration exercises a rule (ties at the
    top-k boundary, a masked token the draft proposes...).
    """

    def walk(sequence, depth):
        ended = depth and eos_token_id is not None and sequence[-1] == eos_token_id
        if depth == n_tokens or ended:
            return
        logits = model.next_logits(sequence)
        yield sequence, logits
        probs = warped_probs(logits, **controls)
        for token in np.flatnonzero(probs):
            yield from walk(sequence + [int(token)], depth + 1)

    yield from walk(list(prompt), 0)


@dataclass
class ChiSquareResult:
    """Outcome of :func:`pooled_chisquare`."""

    statistic: float
    dof: int
    pvalue: float
    n_runs: int
    n_cells: int  # cells after pooling
    n_pooled: int  # support cells that went into the pooled cell
    impossible: int  # runs whose outcome has probability 0 under the law


def pooled_chisquare(outcomes, law, min_expected=5.0):
    """Pearson's chi-square of sampled outcomes against an exact law.

    Every support cell with expectation ``n * P >= min_expected`` is its own cell; the
    others form one pooled cell, which also holds any outcome of probability 0 (so
    the cells partition the whole outcome space and an impossible outcome raises the
    statistic).  If the pooled cell's expectation is still below ``min_expected``,
    it is merged with the smallest remaining cells until it is not.

    Parameters
    ----------
    outcomes : iterable of tuple, or Mapping[tuple, int]
        The sampled outcomes (or their counts).
    law : dict
        Exact law, as returned by ``enumerate_joint_law``.
    min_expected : float
        Smallest expectation of a cell.

    Returns
    -------
    ChiSquareResult
    """
    counts = outcomes if isinstance(outcomes, Mapping) else collections.Counter(outcomes)
    n = sum(counts.values())
    total = sum(law.values())
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"the law sums to {total}, not 1")
    support = {cell: p for cell, p in law.items() if p > 0.0}
    impossible = sum(c for cell, c in counts.items() if cell not in support)
    big = sorted(
        (cell for cell, p in support.items() if n * p >= min_expected),
        key=lambda cell: support[cell],
    )
    small = [cell for cell, p in support.items() if n * p < min_expected]
    pooled_expected = n * sum(support[cell] for cell in small)
    pooled_observed = sum(counts.get(cell, 0) for cell in small) + impossible
    n_pooled = len(small)
    # merge the smallest big cells into the pool until it is large enough
    while (pooled_expected < min_expected and (pooled_observed > 0 or small)) and big:
        cell = big.pop(0)
        pooled_expected += n * support[cell]
        pooled_observed += counts.get(cell, 0)
        n_pooled += 1
    observed = [counts.get(cell, 0) for cell in big]
    expected = [n * support[cell] for cell in big]
    if n_pooled or pooled_observed:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    observed = np.asarray(observed, dtype=float)
    expected = np.asarray(expected, dtype=float)
    if len(observed) < 2:
        return ChiSquareResult(0.0, 0, 1.0, n, len(observed), n_pooled, impossible)
    if np.any(expected == 0):  # only impossible outcomes left to pool: certain rejection
        return ChiSquareResult(
            np.inf, len(observed) - 1, 0.0, n, len(observed), n_pooled, impossible
        )
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    dof = len(observed) - 1
    return ChiSquareResult(
        statistic,
        dof,
        float(_stats.chi2.sf(statistic, dof)),
        n,
        len(observed),
        n_pooled,
        impossible,
    )


def new_tokens(ids, prompt, n_tokens):
    """The first ``n_tokens`` new tokens of a generated ``ids`` list, as a tuple."""
    return tuple(int(t) for t in ids[len(prompt) : len(prompt) + n_tokens])


def same_state(a, b):
    """Equal bit-generator states (MT19937's holds an array)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b
