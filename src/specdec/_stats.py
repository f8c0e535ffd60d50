"""The statistics of one generation: the reference's fields, and where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpeculativeDecodingStats:
    """Statistics of one generation.

    The first four fields and the two properties mean what they meant in the
    reference loop; ``total_draft_tokens_accepted`` counts the kept *prefix* of each
    draft, never a position whose test passed after a rejection.

    Attributes
    ----------
    total_tokens_generated : int
        New tokens appended (accepted drafts, residual and bonus tokens).
    total_draft_tokens_proposed : int
        Draft tokens proposed (and verified).
    total_draft_tokens_accepted : int
        Draft tokens kept.
    num_target_forward_passes : int
        Calls of the target model.
    num_draft_forward_passes : int
        Calls of the draft model (0 for drafters without a model).
    accepted_length_histogram : list of int
        Entry k counts the steps that kept exactly k drafts (length gamma + 1).
    draft_length_histogram : list of int
        Entry n counts the steps that drafted exactly n tokens (length gamma + 1); with
        an adaptive draft length, entry 0 counts the plain steps.
    drafts_by_source : dict of str to dict
        For each draft source (``"model"``, or a drafter's class name), the draft tokens
        it ``"proposed"`` (and were verified) and the ones ``"kept"``.
    draft_time, target_time, decoder_time : float
        Seconds spent in the draft model, in the target model and in specdec itself
        (drafters included).
    """

    total_tokens_generated: int = 0
    total_draft_tokens_proposed: int = 0
    total_draft_tokens_accepted: int = 0
    num_target_forward_passes: int = 0
    num_draft_forward_passes: int = 0
    accepted_length_histogram: list = field(default_factory=list)
    draft_length_histogram: list = field(default_factory=list)
    drafts_by_source: dict = field(default_factory=dict)
    draft_time: float = 0.0
    target_time: float = 0.0
    decoder_time: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed ones (0 when none was proposed)."""
        if self.total_draft_tokens_proposed == 0:
            return 0.0
        return self.total_draft_tokens_accepted / self.total_draft_tokens_proposed

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target pass (0 before the first pass)."""
        if self.num_target_forward_passes == 0:
            return 0.0
        return self.total_tokens_generated / self.num_target_forward_passes

    @property
    def wall_time(self) -> float:
        """Seconds of the whole call: models plus decoder."""
        return self.draft_time + self.target_time + self.decoder_time

    def record_step(self, source: str | None, drafted: int, kept: int, new: int) -> None:
        """Count one target pass that verified ``drafted`` tokens of ``source``.

        Parameters
        ----------
        source : str or None
            Name of the draft source (None: nothing was drafted).
        drafted, kept, new : int
            Draft tokens verified, kept, and tokens appended by the step.
        """
        self.total_draft_tokens_proposed += drafted
        self.total_draft_tokens_accepted += kept
        self.total_tokens_generated += new
        self.num_target_forward_passes += 1
        self.accepted_length_histogram[kept] += 1
        self.draft_length_histogram[drafted] += 1
        if source is not None and drafted:
            counts = self.drafts_by_source.setdefault(source, {"proposed": 0, "kept": 0})
            counts["proposed"] += drafted
            counts["kept"] += kept
