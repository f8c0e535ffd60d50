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
from specdec.drafters._checks import check_proposal
from specdec.drafters.base import Drafter
from specdec.drafters.chain import Chain
from specdec.drafters.length import DraftLengthPolicy

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
        self.names = [
            name if names.count(name) == 1 else f"{name}[{i}]" for i, name in enumerate(names)
        ]
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
                name = self.names[source]
                proposal = check_proposal(drafter.propose(tokens, max_tokens), max_tokens, name)
                if len(proposal):
                    return source, getattr(drafter, "last_match_size", None), proposal
        if self.model is not None:
            return self.model_source, None, None
        return -1, None, _EMPTY

    def extend(self, tokens: np.ndarray, n_new: int) -> None:
        """Show every drafter the tokens a step appended."""
        for drafter in self.drafters:
            drafter.extend(tokens, n_new)


def draft_length(policy: DraftLengthPolicy, source, offered: int) -> int:
    """``policy.length(source, offered)``, refused clearly unless an int in [0, offered]."""
    answer = policy.length(source, offered)
    if type(answer) is int and 0 <= answer <= offered:  # the common case, on every step
        return answer
    expected = f"expected an int in [0, {offered}] (the tokens offered)"
    where = f"draft-length policy {type(policy).__name__}.length() returned {answer!r}"
    if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)):
        raise TypeError(f"{where} ({type(answer).__name__}); {expected}")
    if not 0 <= answer <= offered:
        raise ValueError(f"{where}; {expected}")
    return int(answer)


def check_draft_row(row: np.ndarray, work) -> None:
    """A draft model's row must have the vocabulary of the workspace (the target's).

    The workspace is made for the first model evaluated; when a chained drafter's
    proposal made the target go first, the draft model's first row is checked here.
    """
    if row.shape[0] != work.vocab_size:
        raise ValueError(
            f"draft_model and target_model disagree on the vocabulary: the draft has "
            f"{row.shape[0]} tokens, the target {work.vocab_size}"
        )


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
