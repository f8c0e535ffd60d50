"""Composition of draft sources: the first that has a proposal wins."""

from __future__ import annotations

import numpy as np

from specdec.drafters._checks import check_proposal
from specdec.drafters.base import Drafter

__all__ = ["Chain"]


def _is_model(source) -> bool:
    return not isinstance(source, type) and (
        callable(getattr(source, "forward", None)) or callable(source)
    )


class Chain(Drafter):
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
        self.drafters = tuple(drafters)
        self.model = model
        #: Index of the source of the last :meth:`propose` (-1: none had a proposal).
        self.last_source = -1

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

        The draft model, if any, is sampled by the decoder, not here.

        Parameters
        ----------
        tokens : numpy.ndarray of int64
            The sequence so far.
        max_tokens : int
            The most tokens to propose.

        Returns
        -------
        numpy.ndarray of int64
            The proposal (empty when no drafter has one).
        """
        for i, drafter in enumerate(self.drafters):
            name = f"{type(drafter).__name__} (Chain source {i})"
            proposal = check_proposal(drafter.propose(tokens, max_tokens), max_tokens, name)
            if len(proposal):
                self.last_source = i
                return proposal
        self.last_source = -1
        return np.zeros(0, dtype=np.int64)

    def extend(self, tokens: np.ndarray, n_new: int) -> None:
        """Show every deterministic drafter the kept tokens (see :class:`Drafter`)."""
        for drafter in self.drafters:
            drafter.extend(tokens, n_new)
