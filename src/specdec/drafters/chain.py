"""Composition of draft sources: the first that has a proposal wins.

:class:`Chain` is also how the decoder sees any ``draft_model`` argument
(:meth:`Chain.of`): a lone drafter is a chain of one, a draft model a chain of none
but the model.  The decoder asks the chain for a proposal, learns from
:attr:`Chain.last_source` and :attr:`Chain.last_evidence` who made it, and samples the
draft model itself when no drafter had one.
"""

from __future__ import annotations

import numpy as np

from specdec.drafters._checks import (
    check_candidates,
    check_int_option,
    check_max_tokens,
    check_proposal,
    empty_proposal,
)
from specdec.drafters._threads import PerThread, SharedState
from specdec.drafters.base import Drafter

__all__ = ["Chain"]


def _is_model(source) -> bool:
    return not isinstance(source, type) and (
        callable(getattr(source, "forward", None)) or callable(source)
    )


class Chain(SharedState, Drafter):
    """Draft sources tried in order at every step; the first with a proposal wins.

    The usual order is cheapest and most precise first: prompt lookup (exact copies of
    the input), then a token n-gram model, then a draft model, which always has a
    proposal and so must come last.  Pass a ``Chain`` as the decoder's
    ``draft_model``; the decoder samples the draft model itself, under its sampling
    controls, and verifies the deterministic drafters' proposals as one-hot drafts.

    Parameters
    ----------
    *sources : Drafter or model
        Deterministic drafters, optionally followed by one draft model (an object with
        ``forward(ids) -> logits`` or such a callable).

    Attributes
    ----------
    drafters : tuple of Drafter
        The deterministic drafters, in order.
    model : object or None
        The draft model, if any.
    names : list of str
        Each source's name in the statistics (``drafts_by_source``): the drafter's class
        name (numbered, ``"PromptLookup[1]"``, when a class appears twice), then
        ``"model"`` for the draft model.
    last_source : int
        Index of the source whose proposal :meth:`propose` returned last; -1 when no
        drafter had one.
    last_evidence : int or None
        That drafter's ``last_match_size`` (the length of the context its proposal
        rests on), if it has one; None otherwise.

    Notes
    -----
    A chain may serve several threads at once when its drafters may:
    :attr:`last_source` and :attr:`last_evidence` are kept per thread (each thread
    reads those of its own last proposal).  The drafters of this package may; a
    draft model serves one thread at a time unless it says otherwise.

    Examples
    --------
    >>> from specdec.drafters import Chain, PromptLookup
    >>> drafter = Chain(PromptLookup(), draft_model)  # doctest: +SKIP
    """

    def __init__(self, *sources) -> None:
        if not sources:
            raise ValueError("Chain needs at least one draft source")
        drafters = []
        model = None
        for i, source in enumerate(sources):
            if isinstance(source, Chain):
                raise TypeError("Chain sources cannot be Chains: list their sources instead")
            if isinstance(source, Drafter):
                if model is not None:
                    raise ValueError(
                        "a draft model must be the last source of a Chain "
                        "(it always has a proposal)"
                    )
                drafters.append(source)
            elif _is_model(source):
                if model is not None:
                    raise ValueError("a Chain takes at most one draft model")
                model = source
            else:
                raise TypeError(
                    f"Chain source {i} must be a specdec.drafters.Drafter or a model with "
                    f"forward(ids), got {type(source).__name__}"
                )
        self._set(tuple(drafters), model)

    # the calling thread's last proposal (drafters/_threads.py)
    last_source = PerThread(lambda: -1)
    last_evidence = PerThread(lambda: None)

    def _set(self, drafters: tuple, model) -> None:
        self.drafters = drafters
        self.model = model
        names = [type(d).__name__ for d in drafters] + (["model"] if model is not None else [])
        # the same class twice: number them so that their stats stay apart
        self.names = [
            name if names.count(name) == 1 else f"{name}[{i}]" for i, name in enumerate(names)
        ]
        alone = len(names) == 1
        self._error_names = [
            type(d).__name__ if alone else f"{type(d).__name__} (Chain source {i})"
            for i, d in enumerate(drafters)
        ]
        self.last_source = -1
        self.last_evidence = None

    @classmethod
    def of(cls, draft_model) -> Chain:
        """The decoder's ``draft_model`` argument as a chain.

        A ``Chain`` is itself; a :class:`Drafter` a chain of that drafter; anything else
        a chain of that draft model alone, unchecked (the decoder checks models when it
        wraps them, with errors that name its argument).

        Parameters
        ----------
        draft_model : Chain, Drafter or model

        Returns
        -------
        Chain
        """
        if isinstance(draft_model, Chain):
            return draft_model
        chain = cls.__new__(cls)
        if isinstance(draft_model, Drafter):
            chain._set((draft_model,), None)
        else:
            chain._set((), draft_model)
        return chain

    @property
    def model_source(self) -> int:
        """Index of the draft model among the sources (after the drafters)."""
        return len(self.drafters)

    def __repr__(self) -> str:
        parts = [repr(d) for d in self.drafters]
        if self.model is not None:
            parts.append(f"<model {type(self.model).__name__}>")
        return f"Chain({', '.join(parts)})"

    def start(self, prompt: np.ndarray) -> None:
        """Start every deterministic drafter on a new sequence (see :class:`Drafter`)."""
        for drafter in self.drafters:
            drafter.start(prompt)

    def propose(self, tokens: np.ndarray, max_tokens: int) -> np.ndarray:
        """The first non-empty proposal of the deterministic drafters.

        The draft model, if any, is sampled by the decoder, not here.  Sets
        :attr:`last_source` and :attr:`last_evidence`.

        Parameters
        ----------
        tokens : numpy.ndarray of int64
            The sequence so far.
        max_tokens : int
            The most tokens to propose (0: no drafter is asked).

        Returns
        -------
        numpy.ndarray of int64
            The proposal (empty when no drafter has one).

        Raises
        ------
        TypeError, ValueError
            A drafter's proposal is not 1-D int ids in range, or too long; the message
            names the drafter.
        """
        if check_max_tokens(max_tokens) > 0:
            for i, drafter in enumerate(self.drafters):
                proposal = check_proposal(
                    drafter.propose(tokens, max_tokens), max_tokens, self._error_names[i]
                )
                if len(proposal):
                    self.last_source = i
                    self.last_evidence = getattr(drafter, "last_match_size", None)
                    return proposal
        self.last_source = -1
        self.last_evidence = None
        return empty_proposal()

    def propose_candidates(
        self, tokens: np.ndarray, max_tokens: int, max_candidates: int
    ) -> list[np.ndarray]:
        """The candidates of the first deterministic drafter that has any, best first.

        As :meth:`propose`, for a tree of drafts (see
        :meth:`Drafter.propose_candidates`); sets :attr:`last_source` and
        :attr:`last_evidence`.

        Parameters
        ----------
        tokens : numpy.ndarray of int64
            The sequence so far.
        max_tokens : int
            The most tokens of each candidate (0: no drafter is asked).
        max_candidates : int
            The most candidates (>= 1).

        Returns
        -------
        list of numpy.ndarray of int64
            Non-empty proposals, best first (empty when no drafter has one).
        """
        max_candidates = check_int_option("max_candidates", max_candidates, 1)
        if check_max_tokens(max_tokens) > 0:
            for i, drafter in enumerate(self.drafters):
                candidates = check_candidates(
                    drafter.propose_candidates(tokens, max_tokens, max_candidates),
                    max_tokens,
                    max_candidates,
                    self._error_names[i],
                )
                if candidates:
                    self.last_source = i
                    self.last_evidence = getattr(drafter, "last_match_size", None)
                    return candidates
        self.last_source = -1
        self.last_evidence = None
        return []

    def extend(self, tokens: np.ndarray, n_new: int) -> None:
        """Show every deterministic drafter the kept tokens (see :class:`Drafter`)."""
        for drafter in self.drafters:
            drafter.extend(tokens, n_new)
