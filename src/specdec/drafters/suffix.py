"""Suffix decoding: draft the most frequent continuation from suffix trees.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; the method behind vLLM's
``suffix`` speculative decoding) indexes text in suffix trees and drafts from the
longest match of the sequence's last tokens: the continuation seen most often after
it.  Agents writing tool calls of one schema, rounds of edits to the same code, fields
extracted from documents of one format: their outputs repeat the request's input and
earlier requests' outputs, and a tree over both drafts long runs that prompt lookup,
which copies only the latest occurrence in this request, misses.

Why one module past 500 lines: one drafter class and its two indexes (this request's
and the earlier outputs'), which share its locking; the trie itself is ``_trie.py``.
"""

from __future__ import annotations

import collections
import math
import warnings

import numpy as np

from specdec._deprecation import renamed_arguments
from specdec._validation import MAX_GAMMA, is_real
from specdec.drafters._checks import (
    as_sequence,
    check_ids,
    check_int_option,
    check_max_tokens,
    check_n_new,
    check_probability_option,
    empty_proposal,
)
from specdec.drafters._threads import PerThread, SharedState
from specdec.drafters._trie import SuffixTrie
from specdec.drafters.base import Drafter

#: The largest count option (requests, tokens): far beyond any memory.
MAX_COUNT = 2**62

__all__ = ["SuffixDrafter"]


class SuffixDrafter(SharedState, Drafter):
    """Draft from suffix trees over this request and earlier requests' outputs.

    Two depth-limited suffix trees (tries of every substring of at most ``max_depth``
    tokens, with occurrence counts) are kept: a *local* one over this request's prompt
    and output, rebuilt at each :meth:`start`, and a *global* one over the outputs of
    earlier requests (the tokens after each prompt), kept across requests.  At each
    step, in each tree and for each length ``m`` of a suffix of the sequence that
    occurs in it, the drafter follows the most frequent continuation: from a node,
    the child seen most often after it (ties: the one seen last), whose estimated
    probability is ``count(child) / count(continuations of the node)``; the path's
    probability is the product along it, and the path stops where it falls below
    ``min_probability``, and after ``min(num_tokens, floor(max_spec_factor * m +
    max_spec_offset))`` tokens: the longer the match, the longer the draft.  Of all
    these paths, the one with the highest score (the sum of its probabilities: the
    expected kept tokens if the probabilities were right) wins; ties go to the longer
    match, then to the local tree.

    Memory.  A tree over ``n`` tokens has at most ``n * max_depth`` nodes (fewer when
    text repeats), about 300 bytes each in CPython: at ``max_depth=24``, about 7 MiB
    per 1,000 tokens of varied ids (23 nodes a token; measured with ``tracemalloc``),
    much less for repetitive text.  The local tree indexes at most
    ``max_indexed_tokens`` tokens of a request (16,384 by default: about 115 MiB at
    worst): a longer prompt, or a sequence that grows past the bound, is indexed from
    its last ``max_indexed_tokens // 2`` tokens (rebuilt each time the bound is
    reached, ``O(max_depth)`` per token amortised), so drafting degrades to the
    recent text instead of growing without bound; the sequence itself is kept as 8
    bytes a token.  The global tree holds the
    outputs of at most ``max_cached_requests`` requests and ``max_cached_tokens``
    tokens; when a new output would pass either bound, the oldest outputs are evicted
    first (first in, first out) until it fits.  An output longer than
    ``max_cached_tokens`` is cached truncated to its first ``max_cached_tokens`` tokens.

    An output joins the global tree when the next request starts (:meth:`start`), so
    that a request never drafts from its own output twice; :meth:`reset` empties the
    global tree.

    Threads.  One instance may serve several threads at once (a server's thread pool
    sharing one drafter, so that every request learns from the others' outputs): each
    thread's request (its sequence, local tree and matches, ``last_match_size``...) is
    kept per thread, and the global tree is shared under a lock that every call
    holds (a call costs microseconds beside a target pass).  A thread's output joins
    the global tree when that thread starts its next request.

    Parameters
    ----------
    num_tokens : int in [1, 1024], default 16
        The most tokens proposed per step (vLLM: ``num_speculative_tokens``).
    max_depth : int in [2, 256], default 24
        Longest substring indexed: bounds the match length and the match plus draft.
    max_spec_factor : float in [0, 1024], default 4.0
        A match of ``m`` tokens drafts at most ``max_spec_factor * m + max_spec_offset``.
        (vLLM's default is 1.0; here the decoder's draft-length policy trims what a
        short match proposes, so the drafter may offer more: 4.0 kept 5-30% more
        tokens per pass than 1.0 on bench/bench_multi_request.py's workloads.)
    max_spec_offset : float in [-1024, 1024], default 0.0
        See ``max_spec_factor``.
    min_probability : float in [0, 1], default 0.1
        Stop a draft where its estimated probability falls below this (the name
        :class:`~specdec.drafters.NGram` uses; ``min_token_prob``, ArcticInference's,
        is its deprecated alias until 0.4).
    max_cached_requests : int >= 0, default 64
        Earlier requests whose outputs the global tree keeps (0: no global tree).
    max_cached_tokens : int >= 0, default 16384
        Tokens of earlier outputs the global tree keeps.
    max_indexed_tokens : int >= 2 * max_depth, default 16384
        The most tokens of one request the local tree indexes (see Memory).

    Attributes
    ----------
    last_match_size : int
        The match length ``m`` behind the last proposal (0 if none): the strength of
        its evidence, which the decoder's draft-length policy reads.
    last_probabilities : list of float
        The estimated probability of each token of the last proposal.
    last_tree : {"local", "global", None}
        The tree the last proposal came from.

    Notes
    -----
    Each step costs ``O(max_depth)`` per appended token and
    ``O(max_depth * num_tokens)`` per proposal at worst, independent of the length of
    the sequence; :meth:`start` costs ``O(min(len(prompt), max_indexed_tokens) *
    max_depth)``.  One path is
    proposed per step; the tries keep every branch, ready for trees of candidates.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec.drafters import SuffixDrafter
    >>> drafter = SuffixDrafter(max_spec_factor=1.0)
    >>> drafter.start(np.array([5, 1, 2, 3, 4, 9, 1, 2, 3]))
    >>> drafter.propose(np.array([5, 1, 2, 3, 4, 9, 1, 2, 3]), 8)   # "1 2 3" -> "4 9 1"
    array([4, 9, 1])
    >>> drafter.last_match_size
    3
    """

    #: The largest ``max_spec_factor`` and ``|max_spec_offset|``: a draft is at most
    #: ``num_tokens`` long anyway, so larger values change nothing.
    MAX_SPEC = float(MAX_GAMMA)

    @renamed_arguments("SuffixDrafter()", min_token_prob="min_probability")
    def __init__(
        self,
        num_tokens: int = 16,
        max_depth: int = 24,
        max_spec_factor: float = 4.0,
        max_spec_offset: float = 0.0,
        min_probability: float = 0.1,
        max_cached_requests: int = 64,
        max_cached_tokens: int = 16384,
        max_indexed_tokens: int = 16384,
    ) -> None:
        self.num_tokens = check_int_option("num_tokens", num_tokens, 1, MAX_GAMMA)
        # max_depth bounds every step's work (and the trees' memory): keep it modest
        self.max_depth = check_int_option("max_depth", max_depth, 2, 256)
        bound = self.MAX_SPEC
        for name, value, low in (
            ("max_spec_factor", max_spec_factor, 0.0),
            ("max_spec_offset", max_spec_offset, -bound),
        ):
            expected = f"{name} must be a finite number in [{low:g}, {bound:g}]"
            if not is_real(value) or not math.isfinite(value):
                raise TypeError(f"{expected}, got {type(value).__name__} {value!r}")
            if not low <= value <= bound:
                raise ValueError(f"{expected}, got {value!r}")
        self.max_spec_factor = float(max_spec_factor)
        self.max_spec_offset = float(max_spec_offset)
        self.min_probability = check_probability_option("min_probability", min_probability)
        self.max_cached_requests = check_int_option(
            "max_cached_requests", max_cached_requests, 0, MAX_COUNT
        )
        self.max_cached_tokens = check_int_option(
            "max_cached_tokens", max_cached_tokens, 0, MAX_COUNT
        )
        self.max_indexed_tokens = check_int_option(
            "max_indexed_tokens", max_indexed_tokens, 2 * self.max_depth, MAX_COUNT
        )
        self._epoch = 0  # reset() counts: a thread's request of an older epoch is dropped
        self.reset()

    def __repr__(self) -> str:
        return (
            f"SuffixDrafter(num_tokens={self.num_tokens}, max_depth={self.max_depth}, "
            f"max_spec_factor={self.max_spec_factor}, max_spec_offset={self.max_spec_offset}, "
            f"min_probability={self.min_probability}, max_cached_requests="
            f"{self.max_cached_requests}, max_cached_tokens={self.max_cached_tokens}, "
            f"max_indexed_tokens={self.max_indexed_tokens})"
        )

    @property
    def min_token_prob(self) -> float:
        """Deprecated name of :attr:`min_probability` (until 0.4)."""
        warnings.warn(
            "SuffixDrafter.min_token_prob is deprecated since 0.3; use min_probability",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.min_probability

    # -- state ------------------------------------------------------------------------

    #: The calling thread's request (see :mod:`specdec.drafters._threads`).
    _thread_request = PerThread(lambda: None)

    @property
    def last_match_size(self) -> int:
        """The match length behind this thread's last proposal (0 if none)."""
        return self._request().last_match_size

    @property
    def last_probabilities(self) -> list:
        """The estimated probability of each token of this thread's last proposal."""
        return self._request().last_probabilities

    @property
    def last_tree(self):
        """``"local"``, ``"global"`` or None: the tree of this thread's last proposal."""
        return self._request().last_tree

    def reset(self) -> None:
        """Forget everything: this request and the global tree of earlier outputs.

        Other threads' requests are forgotten too (each re-indexes its sequence at its
        next call, and caches nothing of it).
        """
        with self._lock:
            self._global = SuffixTrie(self.max_depth)
            self._cached: collections.deque = collections.deque()  # outputs, oldest first
            self._cached_tokens = 0
            self._version = 0  # changes of the global tree (a thread's matches go stale)
            self._epoch += 1
            self._thread_request = None

    @property
    def cached_requests(self) -> int:
        """Earlier outputs held by the global tree."""
        return len(self._cached)

    @property
    def cached_tokens(self) -> int:
        """Tokens of earlier outputs held by the global tree."""
        return self._cached_tokens

    @property
    def indexed_tokens(self) -> int:
        """Tokens of this thread's request that the local tree indexes (the last ones)."""
        request = self._request()
        return request.length - request.indexed_from

    def _request(self) -> _Request:
        """The calling thread's request state (fresh after a :meth:`reset`)."""
        request = self._thread_request
        if request is None or request.epoch != self._epoch:
            request = self._thread_request = _Request(self.max_depth, self._epoch)
        return request

    def _restart(self, request: _Request, tokens: np.ndarray) -> None:
        """Index a new sequence in a fresh local tree; match it in the global tree."""
        check_ids(tokens, "tokens", None)  # before the request is cleared
        request.clear()
        request.global_active = self._global.match(tokens[-self.max_depth :].tolist())
        request.version = self._version
        self._append(request, tokens, match_global=False, checked=True)

    def _reindex_tail(self, request: _Request) -> None:
        """Rebuild the local tree over the last ``max_indexed_tokens // 2`` tokens.

        Called when the tree would index more than ``max_indexed_tokens``: halving
        keeps the cost of the rebuilds to ``O(max_depth)`` per appended token.
        """
        keep = min(self.max_indexed_tokens // 2, request.length)
        request.indexed_from = request.length - keep
        request.local = SuffixTrie(self.max_depth)
        active: list = []
        append = request.local.append
        for token in request.buffer[request.indexed_from : request.length].tolist():
            active = append(active, token)
        request.local_active = active

    def _append(
        self, request: _Request, tokens: np.ndarray, match_global: bool = True, checked=False
    ) -> None:
        values = tokens.tolist()  # the loop below needs the list; min() on it is cheap
        if not checked and values and min(values) < 0:  # extend()/propose(): unchecked
            check_ids(tokens, "tokens", None)  # raises, in the shared words
        if request.length + tokens.shape[0] - request.indexed_from > self.max_indexed_tokens:
            # past the bound: the sequence is kept, the local tree re-indexes its tail
            request.push(tokens)
            self._reindex_tail(request)
            if match_global:
                request.global_active = self._global.match(
                    request.buffer[request.length - self.max_depth : request.length].tolist()
                )
            return
        request.push(tokens)
        local, trie = request.local, self._global
        active, global_active = request.local_active, request.global_active
        for token in values:
            active = local.append(active, token)
            if match_global:
                global_active = trie.step(global_active, token)
        request.local_active, request.global_active = active, global_active

    def _commit_output(self, request: _Request) -> None:
        """Move a finished request's output into the global tree (evicting FIFO)."""
        if request.prompt_length is None or self.max_cached_requests == 0:
            return
        end = min(request.length, request.prompt_length + self.max_cached_tokens)
        output = request.buffer[request.prompt_length : end].tolist()
        request.prompt_length = None  # committed once
        if len(output) < 2:
            return
        cached = self._cached
        while cached and (
            len(cached) >= self.max_cached_requests
            or self._cached_tokens + len(output) > self.max_cached_tokens
        ):
            old = cached.popleft()
            self._global.remove(old)
            self._cached_tokens -= len(old)
        self._global.add(output)
        cached.append(output)
        self._cached_tokens += len(output)
        self._version += 1

    def _sync(self, request: _Request, tokens: np.ndarray) -> None:
        """Make the local tree cover ``tokens`` (cheap when it already does)."""
        if request.version != self._version:  # another thread changed the global tree
            request.global_active = self._global.match(
                request.buffer[max(request.length - self.max_depth, 0) : request.length].tolist()
            )
            request.version = self._version
        length, indexed = tokens.shape[0], request.length
        buffer = request.buffer
        k = min(length, self.max_depth)
        if (
            length == indexed
            and buffer[length - k : length].tolist() == tokens[length - k :].tolist()
        ):
            return
        if indexed < length and np.array_equal(buffer[:indexed], tokens[:indexed]):
            self._append(request, tokens[indexed:])
            return
        # not the request start() began: cache nothing of it
        request.prompt_length = None
        self._restart(request, tokens)

    # -- the Drafter interface --------------------------------------------------------

    def start(self, prompt) -> None:
        """Begin a request: cache this thread's previous output, index the prompt.

        A prompt longer than ``max_indexed_tokens`` is indexed from its tail only
        (the bound's rule, in the class's *Memory* notes).

        Parameters
        ----------
        prompt : array_like of int, shape (L,)
            The prompt's token ids.
        """
        prompt = as_sequence(prompt, "prompt")
        check_ids(prompt, "prompt", None)
        with self._lock:
            request = self._request()
            self._commit_output(request)
            self._restart(request, prompt)
            request.prompt_length = request.length

    def propose(self, tokens, max_tokens: int) -> np.ndarray:
        """Propose the most frequent continuation of the longest useful suffix match.

        Parameters
        ----------
        tokens : array_like of int, shape (L,)
            The whole sequence so far.
        max_tokens : int
            The most tokens to propose (>= 0).

        Returns
        -------
        numpy.ndarray of int64
            At most ``min(num_tokens, max_tokens)`` ids; empty when no suffix of the
            sequence has a continuation in either tree.
        """
        tokens = as_sequence(tokens)
        max_tokens = min(check_max_tokens(max_tokens), self.num_tokens)
        with self._lock:
            return self._propose(self._request(), tokens, max_tokens)

    def _propose(self, request: _Request, tokens: np.ndarray, max_tokens: int) -> np.ndarray:
        request.last_match_size, request.last_probabilities, request.last_tree = 0, [], None
        if max_tokens == 0 or tokens.shape[0] == 0:
            return empty_proposal()
        self._sync(request, tokens)
        # score, match length, tokens, probabilities, tree name, (trie, node)
        best = (0.0, 0, [], [], None, None)
        for name, trie, active in (
            ("local", request.local, request.local_active),
            ("global", self._global, request.global_active),
        ):
            best = self._best_path(trie, active, max_tokens, best, name)
        score, match, proposal, probs, tree, request.last_start = best
        if not proposal:
            return empty_proposal()
        request.last_match_size, request.last_probabilities, request.last_tree = match, probs, tree
        return np.array(proposal, dtype=np.int64)

    def _cap(self, match: int, max_tokens: int) -> int:
        """The most tokens a match of ``match`` tokens drafts (see the class)."""
        return int(
            min(float(max_tokens), match * self.max_spec_factor + self.max_spec_offset + 1e-9)
        )

    def propose_candidates(self, tokens, max_tokens: int, max_candidates: int) -> list:
        """The best continuation and the most probable branches off it, best first.

        The first candidate is :meth:`propose`'s; each other one leaves that path at
        one of its nodes by another continuation seen in the same tree, then follows
        the most frequent continuations (the branches whose first new token is the
        most probable first, each at least ``min_probability``).

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
            Non-empty, best first; empty when :meth:`propose` has nothing.
        """
        max_candidates = check_int_option("max_candidates", max_candidates, 1)
        tokens = as_sequence(tokens)
        max_tokens = min(check_max_tokens(max_tokens), self.num_tokens)
        with self._lock:
            request = self._request()
            first = self._propose(request, tokens, max_tokens)
            if not len(first):
                return []
            candidates = [first]
            if max_candidates > 1:
                trie, node = request.last_start
                # the first candidate's cap: a longer match drafts longer (see the class)
                limit = self._cap(request.last_match_size, max_tokens)
                for branch in trie.branches(
                    node, first.tolist(), limit, self.min_probability, max_candidates - 1
                ):
                    candidates.append(np.array(branch, dtype=np.int64))
        return candidates

    def _best_path(self, trie: SuffixTrie, active: list, max_tokens: int, best, name: str):
        """The best of ``best`` and the paths of ``trie`` from the ``active`` matches."""
        min_prob = self.min_probability
        best_score, best_match = best[0], best[1]
        for match in range(len(active), 0, -1):  # longest match first
            cap = self._cap(match, max_tokens)
            # a path's score is at most its length: a shorter match (a smaller cap)
            # cannot beat the best any more
            if cap <= 0 or cap < best_score or (cap == best_score and match <= best_match):
                break
            proposal, probs = trie.walk_path(active[match - 1], cap, min_prob)
            score = math.fsum(probs)
            if score > best_score or (score == best_score and score > 0 and match > best_match):
                best = (score, match, proposal, probs, name, (trie, active[match - 1]))
                best_score, best_match = score, match
        return best

    def extend(self, tokens, n_new: int) -> None:
        """Index the *n_new* appended tokens (``O(max_depth)`` each).

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
        k = min(old, self.max_depth)
        with self._lock:
            request = self._request()
            if (
                old == request.length
                and request.buffer[old - k : old].tolist() == tokens[old - k : old].tolist()
            ):
                if request.version != self._version:
                    self._sync(request, tokens[:old])
                self._append(request, tokens[old:])
            else:
                self._sync(request, tokens)


class _Request:
    """One thread's request: its sequence, the local tree over its last tokens, matches."""

    __slots__ = (
        "max_depth",
        "epoch",
        "buffer",
        "length",
        "indexed_from",
        "local",
        "local_active",
        "global_active",
        "version",
        "prompt_length",
        "last_match_size",
        "last_probabilities",
        "last_tree",
        "last_start",
    )

    def __init__(self, max_depth: int, epoch: int) -> None:
        self.max_depth = max_depth
        self.epoch = epoch
        self.prompt_length = None  # set by start(): where this request's output begins
        self.clear()

    def clear(self) -> None:
        """An empty sequence (the output so far is not cached: prompt_length is kept)."""
        self.buffer = np.zeros(64, dtype=np.int64)
        self.length = 0
        self.indexed_from = 0  # the local tree indexes buffer[indexed_from:length]
        self.local = SuffixTrie(self.max_depth)
        self.local_active: list = []
        self.global_active: list = []
        self.version = -1
        self.last_match_size = 0
        self.last_probabilities: list = []
        self.last_tree = None
        self.last_start = None  # (trie, node) of the last proposal's match

    def push(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` to the sequence (the buffer grows by doubling)."""
        old = self.length
        new = old + tokens.shape[0]
        if new > self.buffer.shape[0]:
            grown = np.zeros(max(new, 2 * self.buffer.shape[0]), dtype=np.int64)
            grown[:old] = self.buffer[:old]
            self.buffer = grown
        self.buffer[old:new] = tokens
        self.length = new
