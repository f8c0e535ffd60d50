"""Interpolated modified Kneser-Ney n-gram language models, trained with NumPy.

The demo's draft and target (:mod:`specdec.toymodels.byte_corpus` trains them on the
standard library's source) are :class:`ByteKneserNey` instances: real language
models, so that acceptance rates mean something, that need no download.  Every
token keeps a non-zero probability in every context.

Examples
--------
>>> from specdec.toymodels.byte_kn import ByteKneserNey
>>> model = ByteKneserNey.train(b"abcabcabd" * 10, order=3)
>>> model.forward([list(b"ab")], logits_to_keep=1).shape
(1, 1, 256)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

__all__ = ["VOCAB_SIZE", "ByteKneserNey"]

#: Vocabulary of the byte-level models: one token per byte value.
VOCAB_SIZE = 256

# Bump when the training algorithm or the file layout changes, so that stale
# cache files are ignored rather than misread.
_FORMAT_VERSION = 1

# ---------------------------------------------------------------------------
# Counting


def _as_tokens(corpus, vocab_size: int) -> np.ndarray:
    """Return *corpus* (bytes or ints) as a flat uint64 array of ids checked against V."""
    if isinstance(corpus, (bytes, bytearray, memoryview)):
        tokens = np.frombuffer(corpus, dtype=np.uint8)
    else:
        tokens = np.asarray(corpus).ravel()
        if tokens.size and tokens.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    return tokens.astype(np.uint64)


def _gram_keys(tokens: np.ndarray, k: int, bits: int) -> np.ndarray:
    """Pack every k-gram of *tokens* into one uint64, oldest token in the high bits.

    Putting the newest token in the low bits means that, once sorted, all grams
    sharing a context are contiguous (the context is ``key >> bits``), and the
    suffix of a gram is a mask of the low bits.
    """
    n = tokens.size - k + 1
    keys = np.zeros(max(n, 0), dtype=np.uint64)
    for j in range(k):
        keys <<= np.uint64(bits)
        keys |= tokens[j : j + n]
    return keys


def _sorted_unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_index=True)`` for an already sorted *a*, in O(len(a))."""
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]]) if a.size else np.zeros(0, np.int64)
    return a[starts], starts


def _discounts(counts: np.ndarray) -> np.ndarray:
    """Modified Kneser-Ney discounts ``(D1, D2, D3+)`` (Chen & Goodman, 1998).

    Estimated from the count-of-counts n1..n4.  Small or peculiar tables can
    make the closed form undefined or negative, so each discount falls back to
    the single-discount estimate and is clipped to ``[0.01, i]``: a positive
    discount is what guarantees every token keeps some probability.
    """
    n = [int(np.count_nonzero(counts == i)) for i in (1, 2, 3, 4)]
    y = n[0] / (n[0] + 2 * n[1]) if n[0] + n[1] else 0.5
    out = np.empty(3)
    for i in (1, 2, 3):
        if n[i - 1]:
            out[i - 1] = i - (i + 1) * y * n[i] / n[i - 1]
        else:
            out[i - 1] = y * i
    return np.clip(out, 0.01, [1.0, 2.0, 3.0])


class _Table:
    """Counts of one order in compressed-sparse-row form, plus derived weights.

    Row ``c`` holds the tokens seen after context ``ctx[c]``:
    ``nxt[indptr[c]:indptr[c+1]]`` with counts ``counts[...]``.  From these and
    the discounts the constructor derives, for interpolated Kneser-Ney,

    * ``alpha`` per entry: ``max(c(h, w) - D(c), 0) / c(h)``;
    * ``bow`` per context: the weight ``gamma(h)`` of the lower-order model.
    """

    __slots__ = ("ctx", "indptr", "nxt", "counts", "discounts", "alpha", "bow")

    def __init__(self, ctx, indptr, nxt, counts, discounts):
        self.ctx = ctx
        self.indptr = indptr
        self.nxt = nxt
        self.counts = counts
        self.discounts = discounts
        c = counts.astype(np.float64)
        starts = indptr[:-1]
        total = np.add.reduceat(c, starts) if c.size else np.zeros(0)
        d = discounts[np.minimum(counts, 3).astype(np.intp) - 1]
        lengths = np.diff(indptr)
        self.alpha = (c - d) / np.repeat(total, lengths)
        self.bow = (np.add.reduceat(d, starts) if c.size else np.zeros(0)) / total

    @classmethod
    def from_grams(cls, keys: np.ndarray, counts: np.ndarray, bits: int) -> _Table:
        """Build from sorted unique gram keys and their counts."""
        ctx, starts = _sorted_unique(keys >> np.uint64(bits))
        indptr = np.append(starts, keys.size).astype(np.int64)
        nxt = (keys & np.uint64((1 << bits) - 1)).astype(np.uint16 if bits <= 16 else np.uint32)
        counts = counts.astype(np.uint32)
        return cls(ctx, indptr, nxt, counts, _discounts(counts))


# ---------------------------------------------------------------------------
# The model


class ByteKneserNey:
    """An interpolated modified Kneser-Ney n-gram language model.

    Instances follow the :mod:`specdec` model protocol: :meth:`forward` maps a
    ``(1, L)`` array of ids to ``(1, L, V)`` float32 logits (log
    probabilities), or to the last ``logits_to_keep`` rows only.

    Create one with :meth:`train` or :meth:`load`, not with the constructor.

    Attributes
    ----------
    order : int
        The n of the n-gram: each prediction looks at ``order - 1`` tokens.
    vocab_size : int
        Number of token ids, ``V``.
    fingerprint : str
        Hex digest identifying the training corpus, order and vocabulary.
    """

    def __init__(self, tables, order: int, vocab_size: int, fingerprint: str = ""):
        self._tables = tables  # _tables[k - 1] predicts from k - 1 tokens
        self.order = order
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self._bits = _bits_for(vocab_size)

    def __repr__(self) -> str:
        return f"ByteKneserNey(order={self.order}, vocab_size={self.vocab_size})"

    # -- training and persistence -------------------------------------------

    @classmethod
    def train(cls, corpus, order: int, vocab_size: int = VOCAB_SIZE) -> ByteKneserNey:
        """Count n-grams in *corpus* and return the smoothed model.

        Parameters
        ----------
        corpus : bytes or array_like of int
            Training text: bytes for a byte-level model, or token ids.
        order : int
            The n of the model, at least 1.
        vocab_size : int, optional
            Number of token ids; ``order * ceil(log2(vocab_size))`` must fit in
            64 bits, since grams are packed into uint64 keys.

        Returns
        -------
        ByteKneserNey

        Notes
        -----
        The highest order uses raw counts; every lower order uses Kneser-Ney
        *continuation* counts (how many distinct tokens precede the gram),
        which is what makes the lower orders good at predicting in contexts
        the higher orders have not seen.  Order 1 interpolates with the
        uniform distribution.
        """
        bits = _bits_for(vocab_size)
        if order < 1:
            raise ValueError("order must be at least 1")
        if order * bits > 64:
            raise ValueError(f"order {order} with vocab_size {vocab_size} does not fit 64-bit keys")
        tokens = _as_tokens(corpus, vocab_size)
        if tokens.size < order + 1:
            raise ValueError("corpus is too short for this order")

        # One sort of the corpus-sized array: every shorter gram type is a
        # prefix of a longer one, except the single gram that starts too
        # close to the end of the corpus to have a longer extension.
        types, counts = np.unique(_gram_keys(tokens, order, bits), return_counts=True)
        tables = [_Table.from_grams(types, counts, bits)]
        for k in range(order - 1, 0, -1):
            # Continuation count of k-gram g: how many distinct (k+1)-grams end in g.
            suffix = types & np.uint64((1 << (bits * k)) - 1)
            keys, counts = np.unique(suffix, return_counts=True)
            tables.append(_Table.from_grams(keys, counts, bits))
            types = _sorted_unique(types >> np.uint64(bits))[0]
            types = np.union1d(types, _gram_keys(tokens[-k:], k, bits))
        tables.reverse()
        return cls(tables, order, vocab_size, _fingerprint(tokens, order, vocab_size))

    def save(self, path) -> None:
        """Write the model to *path* as an uncompressed ``.npz`` file.

        The file is written beside its destination and renamed into place, so
        that a concurrent reader never sees a half-written cache.

        Parameters
        ----------
        path : path-like
            Destination file name.
        """
        arrays = {
            "format_version": np.int64(_FORMAT_VERSION),
            "order": np.int64(self.order),
            "vocab_size": np.int64(self.vocab_size),
            "fingerprint": np.str_(self.fingerprint),
        }
        for k, t in enumerate(self._tables, start=1):
            arrays.update(
                {
                    f"ctx{k}": t.ctx,
                    f"indptr{k}": t.indptr,
                    f"next{k}": t.nxt,
                    f"counts{k}": t.counts,
                    f"discounts{k}": t.discounts,
                }
            )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    @classmethod
    def load(cls, path) -> ByteKneserNey:
        """Read a model written by :meth:`save`.

        Parameters
        ----------
        path : path-like
            A ``.npz`` file.

        Returns
        -------
        ByteKneserNey

        Raises
        ------
        ValueError
            If the file was written by an incompatible version.
        """
        with np.load(path, allow_pickle=False) as z:
            if int(z["format_version"]) != _FORMAT_VERSION:
                raise ValueError(f"{path}: unsupported n-gram file version")
            order = int(z["order"])
            tables = [
                _Table(
                    z[f"ctx{k}"],
                    z[f"indptr{k}"],
                    z[f"next{k}"],
                    z[f"counts{k}"],
                    z[f"discounts{k}"],
                )
                for k in range(1, order + 1)
            ]
            return cls(tables, order, int(z["vocab_size"]), str(z["fingerprint"]))

    # -- inference ----------------------------------------------------------

    def probabilities(self, ids, positions) -> np.ndarray:
        """Next-token distributions after the given positions of one sequence.

        Parameters
        ----------
        ids : array_like of int, shape (L,)
            The sequence.
        positions : array_like of int, shape (n,)
            Indices into *ids*; row ``i`` of the result is the distribution of
            the token following ``ids[positions[i]]``, given up to
            ``order - 1`` tokens ending there.

        Returns
        -------
        numpy.ndarray, shape (n, V), float64
            Each row sums to 1 and has no zero.
        """
        ids = np.asarray(ids, dtype=np.int64).ravel()
        pos = np.asarray(positions, dtype=np.int64).ravel()
        n, V, bits = pos.size, self.vocab_size, np.uint64(self._bits)
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"token ids must lie in [0, {V})")
        p = np.full((n, V), 1.0 / V)
        if n == 0:
            return p
        key = np.zeros(n, dtype=np.uint64)
        for k, table in enumerate(self._tables, start=1):
            if k > 1:
                # Extend each context by one older token, in the high bits.
                back = pos - (k - 2)
                valid = back >= 0
                if not valid.any():
                    break  # shorter history everywhere: higher orders can't apply
                key[valid] |= ids[back[valid]].astype(np.uint64) << (bits * np.uint64(k - 2))
            else:
                valid = np.ones(n, dtype=bool)
            self._interpolate(p, table, key, valid)
        return p

    @staticmethod
    def _interpolate(p, table: _Table, key, valid) -> None:
        """Apply one order in place: ``p <- alpha(h, .) + gamma(h) p`` where h is seen."""
        # Written as whole-batch operations with "not found" rows given weight
        # 1 and no entries, rather than by selecting the found rows first: this
        # runs once per order per call, with n often 1, so the number of NumPy
        # calls matters more than the work inside them.
        idx = np.searchsorted(table.ctx, key)
        np.minimum(idx, table.ctx.size - 1, out=idx)
        found = valid & (table.ctx[idx] == key)
        p *= np.where(found, table.bow[idx], 1.0)[:, None]
        starts = table.indptr[idx]
        lengths = np.where(found, table.indptr[idx + 1] - starts, 0)
        # Scatter the sparse rows: entry j of row r goes to p[r, nxt[j]].
        ends = np.cumsum(lengths)
        entries = np.arange(ends[-1]) + np.repeat(starts - ends + lengths, lengths)
        rows = np.repeat(np.arange(key.size), lengths)
        p[rows, table.nxt[entries]] += table.alpha[entries]

    def forward(self, ids, logits_to_keep: int | None = None) -> np.ndarray:
        """Logits for every position (or the last few) of a batch of one.

        Parameters
        ----------
        ids : array_like of int, shape (1, L)
            The sequence.
        logits_to_keep : int, optional
            Return only the last this many rows; the cost is proportional to
            it, not to L.

        Returns
        -------
        numpy.ndarray, shape (1, n, V), float32
            Log probabilities; row i predicts the token after position
            ``L - n + i``.
        """
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ValueError(f"expected ids of shape (1, L), got {ids.shape}")
        L = ids.shape[1]
        n = L if logits_to_keep is None else int(logits_to_keep)
        if not 0 <= n <= L:
            raise ValueError(f"logits_to_keep={logits_to_keep} is outside [0, {L}]")
        p = self.probabilities(ids[0], np.arange(L - n, L))
        return np.log(p).astype(np.float32)[None]

    def log_likelihood(self, ids, chunk: int = 8192) -> tuple[float, int]:
        """Total natural-log likelihood of a sequence's tokens after the first.

        Parameters
        ----------
        ids : bytes or array_like of int
            The sequence (bytes are taken as byte-level ids).
        chunk : int, optional
            Positions scored per vectorised call; bounds memory to
            ``chunk * V`` floats.

        Returns
        -------
        total : float
            Sum of ``log p(ids[i + 1] | ids[:i + 1])``.
        count : int
            Number of tokens scored, ``len(ids) - 1``.
        """
        tokens = _as_tokens(ids, self.vocab_size).astype(np.int64)
        total = 0.0
        for start in range(0, tokens.size - 1, chunk):
            pos = np.arange(start, min(start + chunk, tokens.size - 1))
            p = self.probabilities(tokens, pos)
            total += float(np.log(p[np.arange(pos.size), tokens[pos + 1]]).sum())
        return total, max(tokens.size - 1, 0)

    def perplexity(self, ids) -> float:
        """Per-token perplexity of a sequence (see :meth:`log_likelihood`).

        Parameters
        ----------
        ids : bytes or array_like of int
            The sequence (bytes are taken as byte-level ids).

        Returns
        -------
        float
            ``exp(-mean log p)``; for a byte model, ``log2`` of it is bits per byte.
        """
        total, count = self.log_likelihood(ids)
        return float(np.exp(-total / count)) if count else float("nan")


def _bits_for(vocab_size: int) -> int:
    if vocab_size < 2:
        raise ValueError("vocab_size must be at least 2")
    return (vocab_size - 1).bit_length()


def _fingerprint(tokens: np.ndarray, order: int, vocab_size: int) -> str:
    h = hashlib.sha256(f"specdec-ngram v{_FORMAT_VERSION} {order} {vocab_size}\n".encode())
    # Hash the narrowest dtype so the digest costs one pass over the corpus size.
    h.update(
        np.ascontiguousarray(tokens, dtype=np.uint8 if vocab_size <= 256 else np.uint32).tobytes()
    )
    return h.hexdigest()[:20]
