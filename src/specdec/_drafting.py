"""Where a step's drafts come from: a draft model, deterministic drafters, or a Chain.

The decoder's ``draft_model`` argument is normalised here into *sources*: the
deterministic drafters (one-hot drafts, proposed by ``propose``) in their order,
then at most one draft model, which the decoder samples under its sampling controls.
The first source with a proposal wins.  This module also holds the per-run buffers
of a model draft's laws and weights, grown as drafts get longer.
"""

from __future__ import annotations

import numpy as np

from specdec._calling import ModelCaller
from specdec._common import LAW_DTYPE
from specdec.drafters.base import Drafter
from specdec.drafters.chain import Chain

_EMPTY = np.zeros(0, dtype=np.int64)


class DraftSources:
    """The draft sources of one ``generate`` call.

    Parameters
    ----------
    draft_model : model, Drafter or Chain
        The decoder's ``draft_model`` argument.
    """

    __slots__ = ("drafters", "model", "names", "deterministic_only")

    def __init__(self, draft_model):
        if isinstance(draft_model, Chain):
            drafters, model = draft_model.drafters, draft_model.model
        elif isinstance(draft_model, Drafter):
            drafters, model = (draft_model,), None
        else:
            drafters, model = (), draft_model
        self.drafters = tuple(drafters)
        # a lone draft_model must be a model: ModelCaller refuses anything else (None too)
        self.model = None if model is None and drafters else ModelCaller(model, "draft_model")
        names = [type(d).__name__ for d in self.drafters]
        if self.model is not None:
            names.append("model")
        # the same class twice in a Chain: number them so that their stats stay apart
        self.names = [name if names.count(name) == 1 else f"{name}[{i}]"
                      for i, name in enumerate(names)]
        self.deterministic_only = self.model is None

    @property
    def model_source(self) -> int:
        """Index of the draft model among the sources (the last one)."""
        return len(self.drafters)

    def start(self, prompt: np.ndarray) -> None:
        """Start every drafter on a new sequence."""
        for drafter in self.drafters:
            drafter.start(prompt)

    def propose(self, tokens: np.ndarray, max_tokens: int):
        """The first proposal, as ``(source, evidence, tokens)``.

        ``tokens`` is None when the draft model is to be sampled, and empty (with
        ``source`` -1) when no source has a proposal.  ``evidence`` is the drafter's
        ``last_match_size`` if it has one (how long a context its proposal rests on),
        so that a draft-length policy can tell strong proposals from weak ones.
        """
        if max_tokens > 0:
            for source, drafter in enumerate(self.drafters):
                proposal = drafter.propose(tokens, max_tokens)
                if len(proposal):
                    return (source, getattr(drafter, "last_match_size", None),
                            _checked_proposal(proposal, max_tokens, self.names[source]))
        if self.model is not None:
            return self.model_source, None, None
        return -1, None, _EMPTY

    def extend(self, tokens: np.ndarray, n_new: int) -> None:
        """Show every drafter the tokens a step appended."""
        for drafter in self.drafters:
            drafter.extend(tokens, n_new)


def _checked_proposal(proposal, max_tokens: int, name: str) -> np.ndarray:
    """A drafter's proposal as int64 ids, refused clearly if it is not one."""
    array = np.asarray(proposal)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"drafter {name} proposed {array.dtype} ids of shape {array.shape}; "
                        "expected a 1-D array of int token ids")
    if len(array) > max_tokens:
        raise ValueError(f"drafter {name} proposed {len(array)} tokens, "
                         f"more than max_tokens={max_tokens}")
    if array.min() < 0:
        raise ValueError(f"drafter {name} proposed a negative token id ({array.min()})")
    return array.astype(np.int64, copy=False)


class DraftRows:
    """A model draft's laws and weights, one row per draft token of the current step.

    Grown geometrically when a step drafts more tokens than any before, so that memory
    follows the longest draft used, not ``gamma`` times the vocabulary up front.
    """

    __slots__ = ("laws", "weights")

    def __init__(self):
        self.laws = np.zeros(0, LAW_DTYPE)
        self.weights = None

    def reserve(self, rows: int, vocab_size: int, dtype) -> None:
        """Make room for ``rows`` draft tokens of ``vocab_size`` weights of ``dtype``."""
        if self.weights is not None and rows <= len(self.laws) and self.weights.dtype == dtype:
            return
        capacity = max(rows, 2 * len(self.laws), 4)
        self.laws = np.zeros(capacity, LAW_DTYPE)
        self.weights = np.empty((capacity, vocab_size), dtype=dtype)
