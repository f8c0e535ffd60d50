"""A token-level n-gram drafter over the target's own token ids.

:class:`NGram` counts which token follows each context of up to ``order - 1``
tokens, in training texts (tokenised with the target's tokenizer) and online in
the prompts and outputs it sees, and proposes the most frequent continuation,
greedily, for as long as its estimate stays confident.  It is the frequency-based
sibling of :class:`~specdec.drafters.PromptLookup` (which copies the most recent
match): it also predicts from text the current sequence has never contained, and
prefers what usually follows to what followed last time.

Why one module past 500 lines: it is one class, whose public methods carry full
docstrings; the file format is in ``_ngram_file.py``, the option checks in
``_checks.py``.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np

from specdec.drafters import _ngram_file
from specdec.drafters._checks import (
    as_sequence,
    check_bool_option,
    check_fits_int64,
    check_ids,
    check_int_option,
    check_max_tokens,
    check_n_new,
    check_probability_option,
    empty_proposal,
)
from specdec.drafters._threads import PerThread
from specdec.drafters.base import Drafter

__all__ = ["NGram"]

# The saved options NGram.load lets a caller override.
_OVERRIDABLE = ("num_tokens", "min_count", "min_probability", "online", "max_grams")

# About 250 MB of counts on random text (about 240 bytes per distinct n-gram).
_DEFAULT_MAX_GRAMS = 2**20


class _Context:
    """What the drafter knows of one context.

    Attributes
    ----------
    total : int
        How often the context was seen (the sum of its n-grams' counts).
    best : int
        Its most frequent successor (ties: the smallest id).
    best_count : int
        That successor's count.
    """

    __slots__ = ("total", "best", "best_count")

    def __init__(self, total: int, best: int, best_count: int):
        self.total = total
        self.best = best
        self.best_count = best_count

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Context):
            return NotImplemented
        return (self.total, self.best, self.best_count) == (
            other.total,
            other.best,
            other.best_count,
        )

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"_Context(total={self.total}, best={self.best}, best_count={self.best_count})"


class NGram(Drafter):
    """Draft the most frequent continuation under token n-gram counts.

    The drafter counts, for every context of 1 to ``order - 1`` tokens, how often
    each token followed it.  To propose, it looks at the sequence's last tokens and
    backs off from the longest context to shorter ones until it finds one seen at
    least *min_count* times; that context's most frequent successor is the next
    proposed token (ties go to the smaller id), and the step repeats with that
    token appended.  A token seen ``c`` times after a context seen ``t`` times is
    estimated to follow with probability ``c / (t + 1)``: its share of the count,
    less an escape share for "something never seen yet" (as in PPM text
    compression), so that a context seen once predicts with 1/2, not with
    certainty.  Drafting stops once the product of these estimates (the estimated
    probability that the whole proposal is right) falls below *min_probability*,
    when no context is usable, or after ``min(num_tokens, max_tokens)`` tokens.

    Parameters
    ----------
    order : int, default 4
        The n of the n-grams: contexts of up to ``order - 1`` tokens, in
        ``[2, NGram.MAX_ORDER]`` (32).
    num_tokens : int, default 10
        The most tokens proposed per step.
    min_count : int, default 1
        A context counts as seen once it occurred this many times; rarer contexts
        are backed off from.  Raise it to distrust single observations.
    min_probability : float, default 0.5
        Stop drafting when the estimated probability of the proposal so far falls
        below it, in ``[0, 1)`` (cf. Hugging Face's
        ``assistant_confidence_threshold`` and llama.cpp's ``--draft-p-min``,
        which apply per token).  0 drafts as long as a context is known.  The
        default is about the cost of one more verified position relative to one
        token on a small CPU model (see the project notes): a drafted token is
        worth verifying when it is kept about half the time.
    vocab_size : int, optional
        When given, every id the drafter learns from must lie in
        ``[0, vocab_size)`` (checked in :meth:`fit`, :meth:`train`, :meth:`start`
        and :meth:`extend`).
    online : bool, default True
        Learn from every prompt (:meth:`start`) and every kept token
        (:meth:`extend`) too.  The counts accumulate across sequences, so a
        drafter serving many requests learns their common phrasing.
    max_grams : int or None, default 2**20
        The most distinct n-grams kept (memory: about 240 bytes each on random
        text, so about 250 MB at the default).  When a new n-gram takes the count
        above it, the least seen contexts are forgotten with their n-grams (see
        Notes); None keeps every n-gram (memory then grows with the text).

    Attributes
    ----------
    last_match_size : int
        Length of the context the last :meth:`propose` matched for its first token
        (0 if it proposed nothing).
    last_probabilities : tuple of float
        For each proposed token, the estimated probability that the proposal is
        right up to and including it (non-increasing, all >= *min_probability*).

    Notes
    -----
    The counts live in two dictionaries keyed by tuples of ids: one gram
    (context plus successor) -> count, and one context -> its total count, most
    frequent successor and that successor's count.  A kept context's counts only
    grow (contexts are forgotten whole, see below), so its most frequent successor
    is maintained exactly on every increment.  A proposed token costs at most
    ``order - 1`` dictionary lookups and an online update at most ``order - 1``
    increments per token: no step does work proportional to the corpus or to the
    sequence.  Memory grows with the distinct n-grams seen (up to ``order - 1`` per
    token); no unigram counts are kept, since a context-free guess is rarely kept.

    *max_grams* bounds that memory.  When a new n-gram makes the number of
    distinct n-grams exceed it, whole contexts are forgotten, with all their
    n-grams, until at most ``3/4 * max_grams`` remain: the contexts seen least
    often first and, among those seen equally often, the ones first seen
    earliest.  A forgotten context is learnt afresh if it occurs again.  Whole
    contexts go so that every kept context's counts and most frequent successor
    stay exact; pruning to 3/4 of the cap keeps its cost (a sort of the contexts)
    to once per ``max_grams / 4`` new n-grams.

    Updates hold a lock, and so does :meth:`save` while it copies the counts:
    saving while another thread generates with the drafter is safe.  One instance
    may serve several threads at once: they learn into the same counts (under the
    lock), and the attributes of the last proposal are kept per thread.

    With *online*, every :meth:`start` counts its prompt again: generating several
    completions of one prompt weighs that prompt's n-grams accordingly (as it
    does the phrasing common to many requests).  Use ``online=False`` to keep a
    trained drafter fixed, e.g. to compare runs.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec.drafters import NGram
    >>> drafter = NGram(order=3).fit([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]])
    >>> drafter.propose(np.array([9, 1]), max_tokens=8)   # then 4 (2 of 3): too weak
    array([2, 3])
    >>> drafter.last_probabilities                        # 3/4, then 3/4 * 3/4
    (0.75, 0.5625)
    """

    #: The largest ``order``: counting costs time and memory in proportion to
    #: ``order ** 2`` per token, and contexts longer than a few tokens are rarely
    #: seen twice anyway.
    MAX_ORDER = 32

    def __init__(
        self,
        order: int = 4,
        *,
        num_tokens: int = 10,
        min_count: int = 1,
        min_probability: float = 0.5,
        vocab_size: int | None = None,
        online: bool = True,
        max_grams: int | None = _DEFAULT_MAX_GRAMS,
    ):
        self._order = check_int_option("order", order, 2, self.MAX_ORDER)
        self.num_tokens = check_int_option("num_tokens", num_tokens, 1)
        self.min_count = check_int_option("min_count", min_count, 1)
        self.min_probability = check_probability_option(
            "min_probability", min_probability, closed=False
        )
        self._vocab_size = (
            None if vocab_size is None else check_int_option("vocab_size", vocab_size, 1)
        )
        self.online = check_bool_option("online", online)
        self._max_grams = None if max_grams is None else check_int_option("max_grams", max_grams, 1)
        # Compared with len(self._counts) on every new gram: no None test on that path.
        self._gram_limit = sys.maxsize if max_grams is None else self._max_grams
        # Held by every update and by save's copy (see save): a drafter serves one
        # sequence at a time, but may be saved from another thread meanwhile.
        self._lock = threading.Lock()
        self._counts: dict[tuple, int] = {}
        self._contexts: dict[tuple, _Context] = {}

    # The last proposal's, so the calling thread's (drafters/_threads.py).
    last_match_size = PerThread(int)
    last_probabilities = PerThread(tuple)

    @property
    def order(self) -> int:
        """The n of the n-grams (fixed: the counts depend on it)."""
        return self._order

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary size ids are checked against, or None."""
        return self._vocab_size

    @property
    def max_grams(self) -> int | None:
        """The most distinct n-grams kept (see the class's Notes), or None."""
        return self._max_grams

    @property
    def num_grams(self) -> int:
        """Number of distinct n-grams (of every length 2 .. order) counted."""
        return len(self._counts)

    def __repr__(self) -> str:
        return (
            f"NGram(order={self._order}, num_tokens={self.num_tokens}, "
            f"min_count={self.min_count}, min_probability={self.min_probability}, "
            f"vocab_size={self._vocab_size}, online={self.online}, "
            f"max_grams={self._max_grams})"
        )

    def __getstate__(self) -> dict:
        # Under the lock that updates hold: a copy or pickle taken while another thread
        # learns sees the counts of one moment, not a dict changing size.
        with self._lock:
            state = self.__dict__.copy()
            state["_counts"] = dict(self._counts)
            state["_contexts"] = {
                context: _Context(seen.total, seen.best, seen.best_count)
                for context, seen in self._contexts.items()
            }
        del state["_lock"]  # a lock cannot be copied or pickled; a copy gets its own
        state.pop("_per_thread", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- learning -------------------------------------------------------------------

    @classmethod
    def train(cls, texts, tokenize, order: int = 4, **options) -> NGram:
        """Count the n-grams of *texts* as the target's tokenizer splits them.

        Parameters
        ----------
        texts : iterable of str
            Training documents; n-grams do not span two documents.
        tokenize : callable
            ``tokenize(text) -> sequence of int``: the target's tokenizer (for
            instance a llama.cpp adapter's ``tokenize``), so that the drafter
            proposes ids the target understands.
        order : int, default 4
            As for the constructor.
        **options
            The constructor's other options.

        Returns
        -------
        NGram
            A new drafter holding the counts.
        """
        if not callable(tokenize):
            raise TypeError(
                f"tokenize must be a callable str -> list of int, got {type(tokenize).__name__}"
            )
        if isinstance(texts, (str, bytes)):
            raise TypeError(
                "texts must be an iterable of str, not a single string (wrap it in a list)"
            )
        drafter = cls(order, **options)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
            ids = drafter._checked(tokenize(text), f"tokenize(texts[{i}])")
            drafter._count_sequence(ids)
        return drafter

    def fit(self, token_sequences) -> NGram:
        """Add the n-gram counts of token sequences.

        Parameters
        ----------
        token_sequences : iterable of array_like of int
            Sequences of ids (for instance tokenised documents); n-grams do not
            span two sequences.  A single sequence must be wrapped in a list.

        Returns
        -------
        NGram
            ``self``, for chaining.
        """
        if isinstance(token_sequences, (str, bytes)):
            raise TypeError(
                "token_sequences must be an iterable of sequences of int ids, not a string"
            )
        try:
            sequences = list(token_sequences)
        except TypeError:
            raise TypeError(
                "token_sequences must be an iterable of sequences of int ids, got "
                f"{type(token_sequences).__name__}"
            ) from None
        checked = []
        # Check everything before counting anything: a bad sequence leaves no trace.
        for i, sequence in enumerate(sequences):
            if np.isscalar(sequence) or (isinstance(sequence, np.ndarray) and sequence.ndim == 0):
                raise TypeError(
                    f"token_sequences[{i}] is not a sequence of ids (got "
                    f"{type(sequence).__name__}); fit takes an iterable of "
                    "sequences: wrap a single sequence in a list"
                )
            checked.append(self._checked(sequence, f"token_sequences[{i}]"))
        with self._lock:
            for ids in checked:
                self._count_sequence(ids)
        return self

    def _checked(self, sequence, name: str) -> list:
        """*sequence* as a list of ints, after the dtype, shape and range checks."""
        if isinstance(sequence, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of int token ids, not a string")
        try:
            array = np.asarray(sequence)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a sequence of int token ids ({exc})") from None
        if array.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold int token ids, got dtype {array.dtype}")
        check_fits_int64(array, name)
        check_ids(array, name, self._vocab_size)
        return array.tolist()

    def _count_sequence(self, ids: list) -> None:
        """Add every n-gram (length 2 .. order) of one sequence."""
        add = self._add
        for n in range(2, self._order + 1):
            if len(ids) < n:
                break
            # Counter over zipped shifted copies counts in C; the Python loop then
            # runs once per distinct gram, not once per position.
            for gram, count in Counter(zip(*(ids[j:] for j in range(n)), strict=False)).items():
                add(gram, count)

    def _add(self, gram: tuple, count: int) -> None:
        """Add *count* observations of *gram* and keep its context's argmax exact."""
        counts = self._counts
        total = counts.get(gram, 0) + count
        counts[gram] = total
        token = gram[-1]
        stats = self._contexts.get(gram[:-1])
        if stats is None:
            self._contexts[gram[:-1]] = _Context(count, token, total)
        else:
            stats.total += count
            # Counts only grow: the new argmax is the old one or the incremented token.
            if total > stats.best_count or (total == stats.best_count and token < stats.best):
                stats.best = token
                stats.best_count = total
        if total == count and len(counts) > self._gram_limit:  # a new gram, over the cap
            self._forget()

    def _forget(self) -> None:
        """Drop the least seen contexts, with their n-grams, to 3/4 of max_grams n-grams.

        Whole contexts go, so that every kept context's counts and most frequent
        successor stay exact.  Order: smallest total count first; among equals, the
        context first seen earliest (the dictionaries keep insertion order, and the
        sort is stable).  Pruning to 3/4 of the cap makes this O(num_grams log) pass
        run once per ``max_grams / 4`` new n-grams at most.
        """
        counts, contexts = self._counts, self._contexts
        target = self._gram_limit * 3 // 4
        successors = Counter(gram[:-1] for gram in counts)
        remaining = len(counts)
        dropped = set()
        for context in sorted(contexts, key=lambda context: contexts[context].total):
            if remaining <= target:
                break
            dropped.add(context)
            remaining -= successors[context]
        self._counts = {gram: count for gram, count in counts.items() if gram[:-1] not in dropped}
        for context in dropped:
            del contexts[context]

    # -- the Drafter interface ------------------------------------------------------

    def start(self, prompt) -> None:
        """Learn the prompt's n-grams (when *online*).

        Parameters
        ----------
        prompt : array_like of int, shape (L,)
            The prompt's token ids.
        """
        prompt = as_sequence(prompt, "prompt")
        check_ids(prompt, "prompt", self._vocab_size)
        if self.online:
            with self._lock:
                self._count_sequence(prompt.tolist())

    def propose(self, tokens, max_tokens: int) -> np.ndarray:
        """Propose the most frequent continuation while it stays likely enough.

        Parameters
        ----------
        tokens : array_like of int, shape (L,)
            The whole sequence so far (only its last ``order - 1`` tokens are read).
        max_tokens : int
            The most tokens to propose (>= 0).

        Returns
        -------
        numpy.ndarray of int64
            At most ``min(num_tokens, max_tokens)`` ids; empty when the sequence's
            last tokens were never seen (at least *min_count* times) or the first
            token's estimated probability is below *min_probability*.
        """
        tokens = as_sequence(tokens)
        max_tokens = check_max_tokens(max_tokens)
        self.last_match_size = 0
        self.last_probabilities = ()
        width = self._order - 1
        context = tokens[max(tokens.shape[0] - width, 0) :].tolist()
        limit = min(self.num_tokens, max_tokens)
        contexts, min_count, min_probability = self._contexts, self.min_count, self.min_probability
        proposal: list[int] = []
        probabilities: list[float] = []
        probability = 1.0
        while len(proposal) < limit:
            # Back off from the longest context to the shortest usable one.
            for size in range(min(width, len(context)), 0, -1):
                stats = contexts.get(tuple(context[-size:]))
                if stats is not None and stats.total >= min_count:
                    break
            else:
                break
            probability *= stats.best_count / (stats.total + 1)
            if probability < min_probability:
                break
            if not proposal:
                self.last_match_size = size
            proposal.append(stats.best)
            probabilities.append(probability)
            context.append(stats.best)
            if len(context) > width:
                del context[0]
        self.last_probabilities = tuple(probabilities)
        if not proposal:
            return empty_proposal()
        return np.array(proposal, dtype=np.int64)

    def extend(self, tokens, n_new: int) -> None:
        """Learn the n-grams ending at the *n_new* appended tokens (when *online*).

        Parameters
        ----------
        tokens : array_like of int, shape (L,)
            The whole sequence after the step.
        n_new : int
            How many tokens were appended (``tokens[-n_new:]``).
        """
        tokens = as_sequence(tokens)
        length = tokens.shape[0]
        n_new = check_n_new(n_new, length)
        if n_new == 0:
            return
        first = length - n_new
        offset = max(first - (self._order - 1), 0)
        window = tokens[offset:].tolist()
        # Python's min / max over a few ints beat a NumPy reduction's call overhead.
        new = window[first - offset :]
        if min(new) < 0 or (self._vocab_size is not None and max(new) >= self._vocab_size):
            check_ids(tokens[first:], "tokens", self._vocab_size)  # raises, with the message
        if not self.online:
            return
        add = self._add
        with self._lock:
            for position in range(first - offset, len(window)):
                for size in range(1, min(self._order - 1, position) + 1):
                    add(tuple(window[position - size : position + 1]), 1)

    # -- persistence ----------------------------------------------------------------

    def save(self, path) -> None:
        """Write the counts and options to *path* (an uncompressed ``.npz`` file).

        The file holds plain arrays only, no pickled objects (the format is described
        in ``drafters/_ngram_file.py``).  The name is used as given (no ``.npz`` is
        appended), and the file is written beside it and renamed into place, so a
        reader never sees a partial file.

        Saving while another thread generates with the drafter is safe: the counts
        are copied under the lock that every update holds, so the file holds the
        counts as they were between two updates.

        Parameters
        ----------
        path : path-like
            Destination file.
        """
        with self._lock:
            items = list(self._counts.items())
        options = {
            "num_tokens": self.num_tokens,
            "min_count": self.min_count,
            "min_probability": self.min_probability,
            "vocab_size": self._vocab_size,
            "online": self.online,
            "max_grams": self._max_grams,
        }
        _ngram_file.write(path, self._order, options, items)

    @classmethod
    def load(cls, path, **options) -> NGram:
        """Read a drafter written by :meth:`save`.

        Nothing the file declares is trusted: its members, their storage and their
        headers are checked before any data is read, so the memory a file takes is
        bounded by its size on disk, and no pickle is ever read.

        Parameters
        ----------
        path : path-like
            The file.
        **options
            Override saved options (``num_tokens``, ``min_count``,
            ``min_probability``, ``online``, ``max_grams``; not ``order`` or
            ``vocab_size``, which the counts depend on).

        Returns
        -------
        NGram

        Raises
        ------
        ValueError
            If the file is not an NGram file of a supported version, or is
            malformed in any way (the message names the file).
        FileNotFoundError
            If there is no such file.
        """
        unknown = set(options) - set(_OVERRIDABLE)
        if unknown:
            raise TypeError(
                f"load() can override only {', '.join(_OVERRIDABLE)}; got "
                f"{', '.join(sorted(unknown))} (order and vocab_size come from "
                "the file: the counts depend on them)"
            )
        path = Path(path)

        def bad(reason: str) -> ValueError:
            return ValueError(f"{path} is not a specdec NGram drafter file: {reason}")

        if not path.is_file():
            raise FileNotFoundError(f"no NGram drafter file at {path}")
        try:
            order, saved, arrays = _ngram_file.read(path)
        except _ngram_file.FileError as exc:
            raise bad(str(exc)) from None
        vocab = saved.pop("vocab_size")
        if saved["max_grams"] is _ngram_file.ABSENT:
            saved["max_grams"] = _DEFAULT_MAX_GRAMS
        try:
            cls(order, vocab_size=vocab, **saved)
        except (TypeError, ValueError) as exc:
            raise bad(f"invalid options ({exc})") from None
        # The caller's overrides are checked as constructor arguments: their errors are
        # the caller's, not the file's.
        drafter = cls(order, vocab_size=vocab, **{**saved, **options})
        try:
            grams = _ngram_file.counted_grams(arrays, order, drafter._vocab_size)
        except _ngram_file.FileError as exc:
            raise bad(str(exc)) from None
        for gram, count in grams:
            drafter._add(gram, count)
        return drafter
