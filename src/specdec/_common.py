"""Definitions shared by both kernel backends and the decoder."""

from __future__ import annotations

#: Elements per block of a sampling pass (must equal SD_BLOCK in _kernels.h).
BLOCK_SIZE = 512

#: Without sampling controls, a row's weights are shifted by the maximum of its first
#: block; only when the row's maximum lies more than this (in units of logit /
#: temperature) above that shift are they recomputed from the maximum itself.
SHIFT_LIMIT = 64.0

#: Kernel error codes, shared by both backends.
NONFINITE_LOGITS = 1
ALL_MASKED_LOGITS = 2
EMPTY_LAW = 3

_REASONS = {
    NONFINITE_LOGITS: "NaN or +inf logits",
    ALL_MASKED_LOGITS: "logits that are all -inf (no token has probability)",
    EMPTY_LAW: "logits that leave no token of positive weight under the sampling controls",
}


class InvalidLogitsError(ValueError):
    """A row of logits that defines no probability law.

    Raised by the kernels with the index of the offending row within the block they
    were given; the decoder re-raises it naming the model and the sequence position.

    Parameters
    ----------
    row : int
        Index of the row within the rows passed to the kernel.
    code : int
        ``NONFINITE_LOGITS``, ``ALL_MASKED_LOGITS`` or ``EMPTY_LAW``.
    """

    def __init__(self, row: int, code: int):
        self.row = row
        self.code = code
        super().__init__(f"row {row} holds {_REASONS[code]}")

    @property
    def reason(self) -> str:
        """What is wrong with the row, in words."""
        return _REASONS[self.code]
