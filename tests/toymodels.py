"""Tiny context-dependent models and exact enumeration of their laws, for tests.

A ``ContextModel``'s logits at position i depend on the tokens at i-1 and i and on
i itself, so the law of the next token changes with the context: a sampler that
used the wrong row, or ignored the context, draws from the wrong law.
"""

from __future__ import annotations

import itertools

import numpy as np


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
    masked : int, optional
        This token id gets -inf everywhere (never possible).
    """

    def __init__(self, vocab_size=5, seed=0, scale=1.5, dtype=np.float64, period=3, masked=None):
        rng = np.random.default_rng(seed)
        # previous token index V stands for "no previous token"
        self.table = (scale * rng.standard_normal((vocab_size + 1, vocab_size, period, vocab_size))).astype(dtype)
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
        return self.table[previous, sequence[-1], (len(sequence) - 1) % self.period].astype(np.float64)


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
        if len(prefix) == n_tokens or (prefix and eos_token_id is not None and prefix[-1] == eos_token_id):
            law[tuple(prefix)] = law.get(tuple(prefix), 0.0) + prob
            return
        probs = warped_probs(model.next_logits(sequence), **controls)
        for token in np.flatnonzero(probs):
            extend(sequence + [int(token)], prefix + [int(token)], prob * probs[token])

    extend(list(prompt), [], 1.0)
    return law
