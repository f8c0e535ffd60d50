"""The seam between drafting and verifying: the :class:`Drafter` interface.

A speculative decoder alternates two roles.  A cheap *drafter* guesses the next few
tokens; the target model scores them all in one forward pass and keeps the longest
prefix that exact speculative sampling accepts, plus one token of its own.  The
drafters of this module are *deterministic*: they propose one candidate per position
(a one-hot draft law), so the decoder keeps a drafted token ``x`` with probability
``p(x)`` under the target and, on a rejection, draws the replacement from ``p`` with
``x`` removed and renormalised.  The output law is the target's exactly, whatever the
drafter proposes; a good drafter only makes decoding faster.

Hugging Face's ``transformers`` draws the same line with its ``CandidateGenerator``
classes (an assistant model, prompt lookup, ...): they propose candidates, the
generation loop verifies them.
"""

from __future__ import annotations

import abc

import numpy as np

from specdec.drafters._checks import check_int_option

__all__ = ["Drafter"]


class Drafter(abc.ABC):
    """Base class of deterministic drafters: one proposed token per position.

    Subclass it to bring your own draft (a lookup table, a grammar, a retrieval
    index, ...).  Only :meth:`propose` is required; :meth:`start` and
    :meth:`extend` let a drafter keep incremental state instead of re-reading
    the whole sequence on every step.

    The decoder drives a drafter in this order, once per ``generate`` call::

        drafter.start(prompt)
        while not done:
            draft = drafter.propose(tokens, max_tokens)   # tokens: prompt + kept tokens
            ...                                           # the target verifies the draft
            drafter.extend(tokens, n_new)                 # tokens[-n_new:] were appended

    With a target that scores a tree of drafts in one pass (``forward_tree``), the
    decoder asks :meth:`propose_candidates` instead: several continuations, best
    first, verified as one tree.

    Notes
    -----
    * ``tokens`` is the whole sequence so far (prompt plus every token kept), as a
      read-only one-dimensional int64 array.  It is a view into the decoder's buffer,
      valid only during the call: copy whatever you keep.
    * Rejected drafts are never shown to :meth:`extend`; the tokens it sees are the
      kept drafts followed by the target's own token.  So a drafter's state can
      never be polluted by a wrong guess.
    * An empty proposal is fine (it means "no idea"): the step then costs one
      ordinary target evaluation.  Propose only what your evidence supports; a
      long, mostly rejected draft makes the target evaluate several tokens to keep
      one.
    * A drafter is stateful and serves one sequence at a time.

    Examples
    --------
    A drafter that always guesses that the last token repeats:

    >>> import numpy as np
    >>> from specdec.drafters import Drafter
    >>> class Repeat(Drafter):
    ...     def propose(self, tokens, max_tokens):
    ...         if len(tokens) == 0 or max_tokens == 0:
    ...             return np.zeros(0, dtype=np.int64)
    ...         return np.full(min(max_tokens, 2), tokens[-1], dtype=np.int64)
    >>> Repeat().propose(np.array([5, 7]), 4)
    array([7, 7])
    """

    def start(self, prompt: np.ndarray) -> None:  # noqa: B027 - an optional hook
        """Begin a new sequence.

        Called once per ``generate`` call, before the first :meth:`propose`.
        The default does nothing.

        Parameters
        ----------
        prompt : numpy.ndarray of int64, shape (L,)
            The prompt's token ids (read-only, valid only during the call).
        """

    @abc.abstractmethod
    def propose(self, tokens: np.ndarray, max_tokens: int) -> np.ndarray:
        """Propose the next tokens of *tokens*.

        Parameters
        ----------
        tokens : numpy.ndarray of int64, shape (L,)
            The whole sequence so far: prompt and kept tokens (read-only, valid
            only during the call).
        max_tokens : int
            The most tokens the decoder will verify in this step (>= 0).

        Returns
        -------
        numpy.ndarray of int64, shape (k,)
            The proposed ids, ``0 <= k <= max_tokens``; empty means no proposal.
            It must be a fresh array (or one the drafter no longer modifies).
        """

    def propose_candidates(
        self, tokens: np.ndarray, max_tokens: int, max_candidates: int
    ) -> list[np.ndarray]:
        """Several candidate continuations of *tokens*, best first, for a tree of drafts.

        Called instead of :meth:`propose` when the decoder can verify a tree of drafts
        in one target pass (a target with ``forward_tree``).  The first candidate is
        what :meth:`propose` would have returned; the others are alternatives (the
        decoder merges shared prefixes, and the draft-length policy decides how many
        of their tokens are worth verifying).  The default has no alternatives.

        Parameters
        ----------
        tokens : numpy.ndarray of int64, shape (L,)
            As for :meth:`propose`.
        max_tokens : int
            The most tokens of each candidate.
        max_candidates : int
            The most candidates (>= 1).

        Returns
        -------
        list of numpy.ndarray of int64
            Non-empty proposals, best first; an empty list for no proposal.
        """
        check_int_option("max_candidates", max_candidates, 1)
        proposal = self.propose(tokens, max_tokens)
        return [proposal] if len(proposal) else []

    def extend(self, tokens: np.ndarray, n_new: int) -> None:  # noqa: B027 - an optional hook
        """Take note that the last *n_new* tokens of *tokens* were appended.

        Called after every step with the tokens the step kept: the accepted
        drafts and the target's token.  The default does nothing.

        Parameters
        ----------
        tokens : numpy.ndarray of int64, shape (L,)
            The whole sequence after the step (read-only, valid only during the
            call).
        n_new : int
            How many tokens the step appended, ``tokens[-n_new:]``.
        """
