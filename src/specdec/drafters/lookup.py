"""Prompt lookup: draft by copying what followed an earlier occurrence of the last n-gram.

When a model quotes, edits or summarises its input (code edits, retrieval answers,
extraction), long spans of the output already occur in the prompt or earlier in the
output.  :class:`PromptLookup` finds the most recent earlier occurrence of the
sequence's last few tokens and proposes the tokens that followed it.  It costs no
model evaluation at all; it is the drafter of Hugging Face's
``prompt_lookup_num_tokens`` option, of llama.cpp's ``lookup`` example and of vLLM's
``ngram`` speculative method.
"""

from __future__ import annotations

import numpy as np

from specdec.drafters._checks import (
    as_sequence,
    check_int_option,
    check_max_tokens,
    check_n_new,
    empty_proposal,
)
from specdec.drafters._threads import PerThread, SharedState
from specdec.drafters.base import Drafter

__all__ = ["PromptLookup"]


class _Request:
    """What a :class:`PromptLookup` keeps about one request's sequence (per thread)."""

    __slots__ = (
        "match_size", "match_position", "matched_n", "ids", "index", "older", "proposed",
        "copy",
    )  # fmt: skip

    def __init__(self) -> None:
        self.match_size = 0  # last_match_size
        self.match_position = -1  # last_match_position
        self.matched_n = 0  # the n of the n-gram the last proposal matched
        # The indexed sequence, as Python ints, and for every n-gram ending at
        # positions 0 .. len(ids) - 2, the start of its latest occurrence.  One dict
        # serves every n: a key's length is its n.  A list, not an array: a step's few
        # reads and comparisons then stay in the interpreter, where each NumPy call
        # would cost 5-15 us right after a model's pass has evicted the caches.
        self.ids: list = []
        self.index: dict = {}
        # (start, n) -> the start of the n-gram's occurrence before the one at start:
        # the occurrences of an n-gram, latest first, for propose_candidates.
        self.older: dict = {}
        # The last proposal, for extend() to confirm: (begin, length, evidence, run,
        # resumed): its source start, the sequence's length then, its match size, how
        # many tokens before begin agree with those before the sequence's end without a
        # break (a match's own size, before a resumption adds the copy's), and whether
        # it resumed a copy; None after an empty one.
        self.proposed = None
        # The tokens last confirmed as copied: (source end, sequence end, evidence,
        # run), the positions just after them in the source and in the
        # sequence, the copy's match size and its unbroken length (since its last
        # edit); None when there is none to resume.
        self.copy = None


class PromptLookup(SharedState, Drafter):
    """Draft by matching the sequence's last n-gram against the text so far.

    For ``n`` from *max_ngram_size* down to *min_ngram_size*, the last ``n`` tokens
    of the sequence are looked up among the earlier ``n``-grams of the sequence
    (prompt and generated text, excluding that trailing ``n``-gram itself).  The
    first ``n`` that matches wins (a longer match is better evidence), and of its
    occurrences the *most recent* one (recent text predicts best, e.g. the line
    being edited).  The tokens that followed it are proposed: at most
    ``min(num_tokens, max_tokens)``, and never beyond the end of the sequence.

    Copies are followed (unless ``copy_window=0``).  The drafter sees, in
    :meth:`extend`, which of its proposed tokens the sequence took: a run of them
    is a *copy*, with its source position and its evidence (the match size plus
    the tokens taken).  While a copy of at least :attr:`RESUMABLE_EVIDENCE` tokens
    goes on, the drafter proposes what follows it in its source, not what follows
    the latest occurrence of the last n-gram (a quote that repeats a phrase of its
    own would otherwise jump to that repetition).  When such a copy breaks (the
    text changes, skips or adds a few tokens) and a match resumes it within
    *copy_window* tokens, at the copy's alignment give or take *copy_window*
    tokens, the match keeps the copy's evidence: a quote in which the model changes
    a word goes on drafting at once, where a fresh one-token match would not.  One
    resumption is tried per break: if its first token is not taken, the copy is
    forgotten, and if the text leaves it again in the same step (where a copied
    block ends, the text often returns for a few tokens only), the copy goes on with
    its new match's evidence alone.

    Parameters
    ----------
    num_tokens : int, default 16
        The most tokens proposed per step (Hugging Face:
        ``prompt_lookup_num_tokens``, 10 by default; llama-cpp-python:
        ``num_pred_tokens``).  Those peers draft that many on every match; here the
        decoder's draft-length policy drafts only what its cost curve says pays, so a
        copy may run long where a pass is cheap (PyTorch: 16 kept about 6% more
        tokens per unit of time than 10 on copies, replayed in
        ``bench/replay_drafting.py``) and costs nothing where it is not.
    max_ngram_size : int, default 3
        Longest n-gram matched, tried first (Hugging Face:
        ``max_matching_ngram_size``); at most ``PromptLookup.MAX_NGRAM_SIZE`` (64).
    min_ngram_size : int, default 1
        Shortest n-gram matched before giving up (an empty proposal).  Raise it to
        propose only on stronger evidence.
    copy_window : int, default 8
        How far a broken copy may be resumed (see above): the sequence has at most
        this many tokens after the break, the resuming match's included (so 2
        resumes a copy after one replaced token), and the match lies at the copy's
        alignment give or take this many.  0 follows no copy: every step takes the
        latest occurrence of its last n-gram, on that match's evidence alone.

    Attributes
    ----------
    last_match_size : int
        How long a context the last :meth:`propose` rests on (0 if it proposed
        nothing): the matched n-gram extended backwards while the tokens before the
        earlier occurrence equal those before the sequence's end, up to
        :attr:`EVIDENCE_LIMIT`.  A text being copied matches over many tokens, a
        chance recurrence over one or two; the default draft-length policy drafts
        accordingly.  A proposal that follows a copy reports the copy's evidence,
        one that resumes a copy the copy's plus its own match's (at most
        :attr:`EVIDENCE_LIMIT`).
    last_match_position : int
        Start of the earlier occurrence the last proposal copied from (-1 if none).

    Notes
    -----
    The drafter keeps a copy of the sequence and a dictionary from every n-gram
    (as a tuple of ids) to the start of its latest occurrence, excluding the
    trailing n-grams.  :meth:`start` builds it from the prompt (O(L)); each
    :meth:`extend` adds the n-grams ending at the appended tokens, and each
    :meth:`propose` costs a few dictionary lookups plus the copy of the proposal:
    ``O(max_ngram_size ** 2 + num_tokens)`` per step, independent of the length of
    the sequence.  Indexing stores ``max_ngram_size - min_ngram_size + 1`` tuples per
    token, of up to ``max_ngram_size`` ids each: time and memory grow linearly with
    the sequence and quadratically with ``max_ngram_size``, hence its bound.

    In repetitive text the latest occurrence may overlap the trailing n-gram, and
    then only the few tokens between them back a proposal (``5 5 5 5`` proposes a
    single ``5``): the drafter does not extrapolate a period it has not seen.

    One instance may serve several threads at once: everything it keeps belongs to
    the request and is kept per thread (the attributes above too), so each thread
    drafts from its own sequence exactly as if alone.

    :meth:`propose` also works without :meth:`start` / :meth:`extend` (called on
    its own, on any sequence): a sequence of another length than the one indexed,
    or whose last tokens differ, is re-indexed (appended to, when the indexed
    sequence is a prefix of it).  A sequence of the same length and with the same
    last ``max_ngram_size`` tokens is taken to be the indexed one; this check is
    what keeps a step at O(1) in the length.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec.drafters import PromptLookup
    >>> drafter = PromptLookup(num_tokens=3)
    >>> tokens = np.array([7, 1, 2, 3, 4, 5, 9, 1, 2])
    >>> drafter.propose(tokens, max_tokens=8)        # "1 2" was followed by "3 4 5"
    array([3, 4, 5])
    >>> drafter.last_match_size
    2
    """

    #: The longest match reported in :attr:`last_match_size` (the backward scan stops).
    EVIDENCE_LIMIT = 32

    #: The largest ``max_ngram_size``: indexing costs time and memory in proportion to
    #: ``max_ngram_size ** 2`` per token (about 20 kB per token at 64), and a match
    #: that long is already a certain copy.
    MAX_NGRAM_SIZE = 64

    #: The shortest copy that a later match may resume (see ``copy_window``): in
    #: open text, agreements of a few tokens with the prompt come and go by chance.
    RESUMABLE_EVIDENCE = 8

    def __init__(
        self,
        num_tokens: int = 16,
        max_ngram_size: int = 3,
        min_ngram_size: int = 1,
        copy_window: int = 8,
    ):
        self.num_tokens = check_int_option("num_tokens", num_tokens, 1)
        self.max_ngram_size = check_int_option(
            "max_ngram_size", max_ngram_size, 1, self.MAX_NGRAM_SIZE
        )
        self.min_ngram_size = check_int_option("min_ngram_size", min_ngram_size, 1)
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(
                f"min_ngram_size must be <= max_ngram_size ({self.max_ngram_size}), "
                f"got {self.min_ngram_size}"
            )
        self.copy_window = check_int_option("copy_window", copy_window, 0)

    # Everything the drafter keeps belongs to the request, so is kept per thread (one
    # instance serves several threads, each indexing its own sequence; see
    # drafters/_threads.py), in one object that each call fetches once.
    _request = PerThread(_Request)

    @property
    def last_match_size(self) -> int:
        """How long a context the last :meth:`propose` rests on (see the class)."""
        return self._request.match_size

    @property
    def last_match_position(self) -> int:
        """Start of the earlier occurrence the last proposal copied from (-1 if none)."""
        return self._request.match_position

    def __repr__(self) -> str:
        return (
            f"PromptLookup(num_tokens={self.num_tokens}, max_ngram_size="
            f"{self.max_ngram_size}, min_ngram_size={self.min_ngram_size}, "
            f"copy_window={self.copy_window})"
        )

    # -- the Drafter interface ------------------------------------------------------

    def start(self, prompt) -> None:
        """Index a new sequence's prompt (O(L)), forgetting the previous sequence.

        Parameters
        ----------
        prompt : array_like of int, shape (L,)
            The prompt's token ids.
        """
        prompt = as_sequence(prompt, "prompt")
        request = self._request = _Request()
        self._append(request, prompt.tolist())

    def propose(self, tokens, max_tokens: int) -> np.ndarray:
        """Propose what followed the latest earlier match of the last n-gram, or the copy's source.

        Parameters
        ----------
        tokens : array_like of int, shape (L,)
            The whole sequence so far.
        max_tokens : int
            The most tokens to propose (>= 0).

        Returns
        -------
        numpy.ndarray of int64
            At most ``min(num_tokens, max_tokens)`` ids; empty when no n-gram of
            length *min_ngram_size* or more recurs (in particular when
            ``len(tokens) <= min_ngram_size``).
        """
        tokens = as_sequence(tokens)
        max_tokens = check_max_tokens(max_tokens)
        request = self._request
        request.match_size = 0
        request.match_position = -1
        request.proposed = None
        length = tokens.shape[0]
        # A match needs an earlier start, so n <= length - 1.
        top = min(self.max_ngram_size, length - 1)
        if max_tokens == 0 or top < self.min_ngram_size:
            return empty_proposal()
        tail = tokens[length - top :].tolist()
        request = self._sync(request, tokens, tail)
        followed = self._followed(request, length, tail)
        if followed is not None:
            begin, n, match, run = followed
            return self._proposal(request, begin, n, match, run, False, length, max_tokens)
        index = request.index
        for n in range(top, self.min_ngram_size - 1, -1):
            start = index.get(tuple(tail[top - n :]))
            if start is not None:
                begin = start + n  # <= length - 1: the trailing n-gram is not indexed
                own = self._extended(request.ids, start, length - n, n)
                resumed = self._resumes(request, begin, length, own)
                match = min(own + resumed, self.EVIDENCE_LIMIT)
                return self._proposal(
                    request, begin, n, match, own, resumed > 0, length, max_tokens
                )
        return empty_proposal()

    def _proposal(self, request, begin, n, match, run, resumed, length, max_tokens) -> np.ndarray:
        """Record a match (for the attributes and :meth:`extend`) and copy its proposal."""
        request.match_size = match
        request.match_position = begin - n
        request.matched_n = n
        request.proposed = (begin, length, match, run, resumed)
        end = min(begin + self.num_tokens, begin + max_tokens, length)
        return np.array(request.ids[begin:end], dtype=np.int64)

    #: Earlier occurrences looked at per call of :meth:`propose_candidates`, at most.
    MAX_OCCURRENCES = 32

    def propose_candidates(self, tokens, max_tokens: int, max_candidates: int) -> list:
        """What followed each of the latest occurrences of the matched n-gram, latest first.

        The first candidate is :meth:`propose`'s proposal (a followed copy's, if any);
        the others continue the same n-gram's occurrences, latest first (up to
        :attr:`MAX_OCCURRENCES` looked at), each kept only if it adds a continuation no
        earlier candidate holds.

        Parameters
        ----------
        tokens : array_like of int, shape (L,)
            The whole sequence so far.
        max_tokens : int
            The most tokens per candidate (>= 0).
        max_candidates : int
            The most candidates (>= 1).

        Returns
        -------
        list of numpy.ndarray of int64
            Non-empty, best (latest) first; empty when :meth:`propose` has nothing.
        """
        tokens = as_sequence(tokens)
        max_candidates = check_int_option("max_candidates", max_candidates, 1)
        first = self.propose(tokens, max_tokens)
        if not len(first):
            return []
        candidates = [first]
        request = self._request
        n, start = request.matched_n, request.match_position
        limit = min(self.num_tokens, max_tokens)
        length = tokens.shape[0]
        best = first.tolist()
        seen = {tuple(best[:i]) for i in range(1, len(best) + 1)}
        older, ids = request.older, request.ids
        latest = request.index.get(tuple(tokens[length - n :].tolist()))
        # A followed copy's source need not be the latest occurrence: walk from that.
        following = latest is not None and latest != start
        for _ in range(self.MAX_OCCURRENCES):
            if len(candidates) >= max_candidates:
                break
            start = latest if following else older.get((start, n))
            following = False
            if start is None:
                break
            begin = start + n
            key = tuple(ids[begin : min(begin + limit, length)])
            if not key or key in seen:
                continue  # a prefix of an earlier candidate adds nothing
            seen.update(key[:i] for i in range(1, len(key) + 1))
            candidates.append(np.array(key, dtype=np.int64))
        return candidates

    def extend(self, tokens, n_new: int) -> None:
        """Index the n-grams that end at the *n_new* appended tokens.

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
        old = length - n_new
        request = self._request
        ids = request.ids
        if old == len(ids) and old > 0:
            # The decoder's protocol: tokens[:old] is the indexed sequence.  Checking
            # its last tokens (O(max_ngram_size)) catches a skipped start().
            k = min(old, self.max_ngram_size)
            recent = tokens[old - k :].tolist()
            if ids[old - k :] == recent[:k]:
                appended = recent[k:]
                self._append(request, appended)
                self._confirm(request, old, appended)
                return
        self._sync(request, tokens, None)

    def _extended(self, ids: list, earlier: int, later: int, n: int) -> int:
        """``n`` plus how many tokens before the two n-gram occurrences agree (capped)."""
        limit = self.EVIDENCE_LIMIT
        match = n
        while match < limit and earlier > 0 and ids[earlier - 1] == ids[later - 1]:
            match += 1
            earlier -= 1
            later -= 1
        return match

    def _followed(self, request: _Request, length: int, tail: list):
        """``(begin, n, match, run)`` continuing the copy the sequence's last token confirmed.

        None unless a copy of at least :attr:`RESUMABLE_EVIDENCE` tokens ends at the
        sequence's end (its source then ends earlier: :meth:`_confirm` counts only
        source tokens before the step's first, so there is always one to propose).
        """
        copy = request.copy
        if copy is None or copy[1] != length:
            return None
        source_end, _, evidence, run = copy
        n = min(len(tail), run)  # the tokens before source_end that match without a break
        if (
            evidence < self.RESUMABLE_EVIDENCE
            or n < self.min_ngram_size
            or request.ids[source_end - n : source_end] != tail[len(tail) - n :]
        ):
            return None
        return source_end, n, evidence, run

    def _resumes(self, request: _Request, begin: int, length: int, own: int) -> int:
        """The evidence of the broken copy that a match from *begin* resumes (0: none).

        *own* is the match's size: a match reaching back over the supposed break (a
        step the drafter was not asked about, say) already counts those tokens.
        """
        if not self._resumable(request, length):
            return 0
        source_end, sequence_end, evidence, _ = request.copy
        since = length - sequence_end  # tokens written since the copy broke
        if own < since and abs(begin - source_end - since) <= self.copy_window:
            return evidence
        return 0

    def _confirm(self, request: _Request, old: int, appended: list) -> None:
        """After the sequence grew from *old* by *appended*: how much of the proposal it took.

        The proposal's leading tokens that the sequence took extend the copy (its
        source and sequence ends move on, its evidence grows); a resumption whose first
        token was not taken ends it, and one left again within the step keeps its own
        match's evidence only.
        """
        if not appended:
            return
        proposed, request.proposed = request.proposed, None
        if proposed is None or proposed[1] != old or not self.copy_window:
            return
        begin, _, evidence, run, resumed = proposed
        source = request.ids[begin : min(begin + len(appended), old)]
        taken = 0
        for copied, written in zip(source, appended, strict=False):
            if copied != written:
                break
            taken += 1
        if taken:
            if resumed and taken < len(appended):  # broken again at once: its own match only
                evidence = run
            evidence = min(evidence + taken, self.EVIDENCE_LIMIT)
            if (
                resumed
                or evidence >= self.RESUMABLE_EVIDENCE
                or not self._resumable(request, old + taken)
            ):
                # a chance agreement of a few tokens does not replace a copy still
                # resumable there
                request.copy = (begin + taken, old + taken, evidence, run + taken)
        elif resumed:
            request.copy = None

    def _resumable(self, request: _Request, length: int) -> bool:
        """Whether the copy could still be resumed by a match at sequence *length*."""
        copy = request.copy
        return (
            copy is not None
            and copy[2] >= self.RESUMABLE_EVIDENCE
            and length - copy[1] <= self.copy_window
        )

    # -- the index ------------------------------------------------------------------

    def _sync(self, request: _Request, tokens: np.ndarray, tail: list | None) -> _Request:
        """Make the index cover *tokens*, re-indexing only when it does not already.

        *tail* is ``tokens[-k:].tolist()`` for some k <= max_ngram_size, when the
        caller has it at hand.  Returns the request's state (a new one if re-indexed).
        """
        length, ids = tokens.shape[0], request.ids
        indexed = len(ids)
        if length == indexed:
            if tail is None:
                k = min(length, self.max_ngram_size)
                tail = tokens[length - k :].tolist()
            if ids[length - len(tail) :] == tail:
                return request
        elif indexed < length and tokens[:indexed].tolist() == ids:
            self._append(request, tokens[indexed:].tolist())
            return request
        fresh = self._request = _Request()
        self._append(fresh, tokens.tolist())
        return fresh

    def _append(self, request: _Request, new: list) -> None:
        """Append the ids *new* to the indexed sequence and index the n-grams they complete."""
        ids = request.ids
        old = len(ids)
        ids.extend(new)
        # The index covers n-grams ending at positions <= len(ids) - 2 (the n-grams
        # ending at the last token are the trailing ones, never matched against
        # themselves).  Newly covered: those ending at old - 1 .. len(ids) - 2.
        first, last = max(old - 1, 0), len(ids) - 2
        if last < first:
            return
        sizes = range(self.min_ngram_size, self.max_ngram_size + 1)
        index, older = request.index, request.older
        # Increasing end positions: a later occurrence overwrites an earlier one, which
        # it links to.
        for end in range(first, last + 1):
            stop = end + 1
            for n in sizes:
                begin = stop - n
                if begin < 0:
                    break
                key = tuple(ids[begin:stop])
                previous = index.get(key)
                index[key] = begin
                if previous is not None:
                    older[(begin, n)] = previous
