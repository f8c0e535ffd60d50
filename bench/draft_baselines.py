"""Draft-length policies that benchmarks compare specdec's default with (not the library's).

:class:`HeuristicDraftLength` is Hugging Face's ``num_assistant_tokens_schedule=
"heuristic"``, kept here as a baseline for ``bench/bench_end_to_end.py`` (kind
``lookup-heuristic``); the library's policies are in :mod:`specdec.drafters`.
"""

from __future__ import annotations

from specdec.drafters import DraftLengthPolicy

__all__ = ["HeuristicDraftLength"]


class HeuristicDraftLength(DraftLengthPolicy):
    """Hugging Face's ``num_assistant_tokens_schedule="heuristic"``.

    +2 after a fully kept draft, -1 otherwise (never below 1).  A baseline to compare
    with.

    Parameters
    ----------
    initial : int, default 5
        The first draft length (Hugging Face's ``num_assistant_tokens``).
    """

    def __init__(self, initial: int = 5) -> None:
        if not isinstance(initial, int) or isinstance(initial, bool) or initial < 1:
            raise ValueError(f"initial must be an int >= 1, got {initial!r}")
        self.initial = int(initial)

    def start(self, max_tokens: int, target_cost=None) -> None:
        # one run at a time: a benchmark's policy is not shared between threads
        self._max = max_tokens
        self._current = min(self.initial, max_tokens)

    def length(self, key, offered: int) -> int:
        return min(offered, self._current)

    def observe(self, key, drafted, kept, target_seconds, shadow) -> None:
        if drafted == 0:
            return
        step = 2 if kept == drafted else -1
        self._current = min(self._max, max(1, self._current + step))

    def __repr__(self) -> str:
        return f"HeuristicDraftLength(initial={self.initial})"
