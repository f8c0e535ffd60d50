"""Suffix decoding: draft the most frequent continuation from suffix trees.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; the method behind vLLM's
``suffix`` speculative decoding) indexes text in suffix trees and drafts from the
longest match of the sequence's last tokens: the continuation seen most often after
it.  Agents writing tool calls of one schema, rounds of edits to the same code, fields
extracted from documents of one format: their outputs repeat the request's input and
earlier requests' outputs, and a tree over both drafts long runs that prompt lookup,
which copies only the latest occurrence in this request, misses.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from specdec._validation import is_real
from specdec.drafters._checks import (
    as_sequence,
    check_int_option,
    check_max_tokens,
    check_n_new,
    check_probability_option,
    empty_proposal,
)
from specdec.drafters._trie import SuffixTrie
from specdec.drafters.base import Drafter

__all__ = ["SuffixDrafter"]


class SuffixDrafter(Drafter):
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
    ``min_token_prob``, and after ``min(num_tokens, floor(max_spec_factor * m +
    max_spec_offset))`` tokens: the longer the match, the longer the draft.  Of all
    these paths, the one with the highest score (the sum of its probabilities: the
    expected kept tokens if the probabilities were right) wins; ties go to the longer
    match, then to the local tree.

    Memory.  A tree over ``n`` tokens has at most ``n * max_depth`` nodes (fewer when
    text repeats), about 300 bytes each in CPython (an 8k-token prompt: about 150k
    nodes, 45 MiB at ``max_depth=24``).  The global tree holds the
    outputs of at most ``max_cached_requests`` requests and ``max_cached_tokens``
    tokens; when a new output would pass either bound, the oldest outputs are evicted
    first (first in, first out) until it fits.  An output longer than
    ``max_cached_tokens`` is cached truncated to its first ``max_cached_tokens`` tokens.

    An output joins the global tree when the next request starts (:meth:`start`), so
    that a request never drafts from its own output twice; :meth:`reset` empties the
    global tree.

    Parameters
    ----------
    num_tokens : int, default 16
        The most tokens proposed per step (vLLM: ``num_speculative_tokens``).
    max_depth : int, default 24
        Longest substring indexed: bounds the match length and the match plus draft.
    max_spec_factor : float >= 0, default 4.0
        A match of ``m`` tokens drafts at most ``max_spec_factor * m + max_spec_offset``.
        (vLLM's default is 1.0; here the decoder's draft-length policy trims what a
        short match proposes, so the drafter may offer more: 4.0 kept 5-30% more
        tokens per pass than 1.0 on bench/bench_multi_request.py's workloads.)
    max_spec_offset : float, default 0.0
        See ``max_spec_factor``.
    min_token_prob : float in [0, 1], default 0.1
        Stop a draft where its estimated probability falls below this.
    max_cached_requests : int >= 0, default 64
        Earlier requests whose outputs the global tree keeps (0: no global tree).
    max_cached_tokens : int >= 0, default 16384
        Tokens of earlier outputs the global tree keeps.

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
    the sequence; :meth:`start` costs ``O(len(prompt) * max_depth)``.  One path is
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

    def __init__(
        self,
        num_tokens: int = 16,
        max_depth: int = 24,
        max_spec_factor: float = 4.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 64,
        max_cached_tokens: int = 16384,
    ) -> None:
        self.num_tokens = check_int_option("num_tokens", num_tokens, 1)
        # max_depth bounds every step's work (and the trees' memory): keep it modest
        self.max_depth = check_int_option("max_depth", max_depth, 2)
        if self.max_depth > 256:
            raise ValueError(f"max_depth must be an int in [2, 256], got {max_depth}")
        for name, value in (
            ("max_spec_factor", max_spec_factor),
            ("max_spec_offset", max_spec_offset),
        ):
            if not is_real(value) or not math.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {max_spec_factor}")
        self.max_spec_factor = float(max_spec_factor)
        self.max_spec_offset = float(max_spec_offset)
        self.min_token_prob = check_probability_option("min_token_prob", min_token_prob)
        self.max_cached_requests = check_int_option("max_cached_requests", max_cached_requests, 0)
        self.max_cached_tokens = check_int_option("max_cached_tokens", max_cached_tokens, 0)
        self.last_match_size = 0
        self.last_probabilities: list = []
        self.last_tree = None
        self._last_start = None  # (trie, node) of the last proposal's match
        self.reset()

    def __repr__(self) -> str:
        return (
            f"SuffixDrafter(num_tokens={self.num_tokens}, max_depth={self.max_depth}, "
            f"max_spec_factor={self.max_spec_factor}, max_spec_offset={self.max_spec_offset}, "
            f"min_token_prob={self.min_token_prob}, max_cached_requests="
            f"{self.max_cached_requests}, max_cached_tokens={self.max_cached_tokens})"
        )

    # -- state ------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything: this request and the global tree of earlier outputs."""
        self._global = SuffixTrie(self.max_depth)
        self._cached: collections.deque = collections.deque()  # outputs, oldest first
        self._cached_tokens = 0
        self._restart([])
        self._prompt_length = None  # set by start(): where this request's output begins

    @property
    def cached_requests(self) -> int:
        """Earlier outputs held by the global tree."""
        return len(self._cached)

    @property
    def cached_tokens(self) -> int:
        """Tokens of earlier outputs held by the global tree."""
        return self._cached_tokens

    def _restart(self, tokens: list) -> None:
        """Index a new sequence in a fresh local tree; match it in the global tree."""
        self._local = SuffixTrie(self.max_depth)
        self._sequence: list = []
        self._local_active: list = []
        self._global_active = self._global.match(tokens)
        self._append(tokens, match_global=False)

    def _append(self, tokens, match_global: bool = True) -> None:
        local, trie = self._local, self._global
        active = self._local_active
        global_active = self._global_active
        for token in tokens:
            active = local.append(active, token)
            if match_global:
                global_active = trie.step(global_active, token)
        self._local_active, self._global_active = active, global_active
        self._sequence.extend(tokens)

    def _commit_output(self) -> None:
        """Move the finished request's output into the global tree (evicting FIFO)."""
        if self._prompt_length is None or self.max_cached_requests == 0:
            return
        output = self._sequence[self._prompt_length :][: self.max_cached_tokens]
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

    def _sync(self, tokens: np.ndarray) -> None:
        """Make the local tree cover ``tokens`` (cheap when it already does)."""
        length, indexed = tokens.shape[0], len(self._sequence)
        k = min(length, self.max_depth)
        if length == indexed and self._sequence[length - k :] == tokens[length - k :].tolist():
            return
        if indexed < length and self._sequence == tokens[:indexed].tolist():
            self._append(tokens[indexed:].tolist())
            return
        self._prompt_length = None  # not the request start() began: cache nothing of it
        self._restart(tokens.tolist())

    # -- the Drafter interface --------------------------------------------------------

    def start(self, prompt) -> None:
        """Begin a request: cache the previous request's output, index the prompt.

        Parameters
        ----------
        prompt : array_like of int, shape (L,)
            The prompt's token ids.
        """
        prompt = as_sequence(prompt, "prompt")
        self._commit_output()
        self._restart(prompt.tolist())
        self._prompt_length = len(self._sequence)

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
        self.last_match_size, self.last_probabilities, self.last_tree = 0, [], None
        if max_tokens == 0 or tokens.shape[0] == 0:
            return empty_proposal()
        self._sync(tokens)
        # score, match length, tokens, probabilities, tree name, (trie, node)
        best = (0.0, 0, [], [], None, None)
        for name, trie, active in (
            ("local", self._local, self._local_active),
            ("global", self._global, self._global_active),
        ):
            best = self._best_path(trie, active, max_tokens, best, name)
        score, match, proposal, probs, tree, self._last_start = best
        if not proposal:
            return empty_proposal()
        self.last_match_size, self.last_probabilities, self.last_tree = match, probs, tree
        return np.array(proposal, dtype=np.int64)

    def propose_candidates(self, tokens, max_tokens: int, max_candidates: int) -> list:
        """The best continuation and the most probable branches off it, best first.

        The first candidate is :meth:`propose`'s; each other one leaves that path at
        one of its nodes by another continuation seen in the same tree, then follows
        the most frequent continuations (the branches whose first new token is the
        most probable first, each at least ``min_token_prob``).

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
        first = self.propose(tokens, max_tokens)
        if not len(first):
            return []
        candidates = [first]
        if max_candidates > 1:
            trie, node = self._last_start
            # the first candidate's cap: a longer match drafts longer (see the class)
            limit = min(
                check_max_tokens(max_tokens),
                self.num_tokens,
                int(self.last_match_size * self.max_spec_factor + self.max_spec_offset + 1e-9),
            )
            for branch in trie.branches(
                node, first.tolist(), limit, self.min_token_prob, max_candidates - 1
            ):
                candidates.append(np.array(branch, dtype=np.int64))
        return candidates

    def _best_path(self, trie: SuffixTrie, active: list, max_tokens: int, best, name: str):
        """The best of ``best`` and the paths of ``trie`` from the ``active`` matches."""
        factor, offset, min_prob = self.max_spec_factor, self.max_spec_offset, self.min_token_prob
        best_score, best_match = best[0], best[1]
        for match in range(len(active), 0, -1):  # longest match first
            cap = min(max_tokens, int(match * factor + offset + 1e-9))
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
        if (
            old == len(self._sequence)
            and self._sequence[old - k :] == tokens[old - k : old].tolist()
        ):
            self._append(tokens[old:].tolist())
        else:
            self._sync(tokens)
