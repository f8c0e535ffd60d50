"""Terminal output of the ``specdec`` command: stderr lines, progress, tables, text."""

from __future__ import annotations

import json
import sys
import time

__all__ = [
    "stderr_line",
    "one_line",
    "Progress",
    "printable",
    "bar_chart",
    "row",
    "print_json",
    "table",
]


def stderr_line(text: str) -> None:
    """Write one line on stderr, flushed at once (progress may follow)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def one_line(error, limit: int = 240) -> str:
    """An error's message as one line: its lines joined, cut after ``limit`` characters.

    A loader's message may run to pages (transformers lists the tokenizer formats it
    tried); the CLI reports failures as one line.

    Parameters
    ----------
    error : BaseException or str
    limit : int, optional
        Most characters kept (the cut ends with "...").

    Returns
    -------
    str
    """
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if not text:
        return type(error).__name__
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return text


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal, only for long runs.

    Nothing is written before *delay* seconds have passed, so quick runs never
    flicker, and nothing at all when stderr is not a TTY (a log file would
    fill with carriage returns).

    Parameters
    ----------
    label : str
        Text before the bar.
    total : int
        The count at which the bar is full.
    enabled : bool, optional
        False draws nothing.
    delay : float, optional
        Seconds before the first drawing.
    unit : str, optional
        What is counted, after ``done/total``.
    """

    WIDTH = 30

    def __init__(self, label, total, enabled=True, delay=0.5, unit="tokens"):
        self.label, self.total, self.unit = label, total, unit
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.delay = delay
        self.drawn_at = None
        self.drawn_length = 0

    def update(self, done: int) -> None:
        """Redraw the bar at *done* (at most ten times a second)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start < self.delay:
            return
        if self.drawn_at is not None and now - self.drawn_at < 0.1:
            return  # redrawing faster than the eye can follow only costs time
        self.drawn_at = now
        done = max(0, min(done, self.total))
        filled = self.WIDTH * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"{self.label} [{bar}] {done}/{self.total} {self.unit}"
        # Pad over a longer previous line; plain spaces rather than an ANSI
        # erase so that consoles without escape sequences stay clean too.
        sys.stderr.write("\r" + line.ljust(self.drawn_length))
        sys.stderr.flush()
        self.drawn_length = max(self.drawn_length, len(line))

    def close(self) -> None:
        """Erase the bar, if it was drawn."""
        if self.drawn_at is not None:
            sys.stderr.write("\r" + " " * self.drawn_length + "\r")
            sys.stderr.flush()
            self.drawn_at = None


def printable(text: str) -> str:
    """Escape control characters other than newline and tab.

    Sampled bytes can form terminal escape sequences; printing them raw could
    recolour or clear the user's terminal.  Lone surrogates (which no terminal
    can encode) are escaped too.

    Parameters
    ----------
    text : str

    Returns
    -------
    str
    """
    return "".join(
        c if (c.isprintable() and not "\ud800" <= c <= "\udfff") or c in "\n\t" else repr(c)[1:-1]
        for c in text
    )


def bar_chart(counts, width: int = 30) -> list[str]:
    """Rows ``k | ####   count`` scaled to the largest count.

    Parameters
    ----------
    counts : sequence of int
        One count per row, labelled by its index.
    width : int, optional
        Characters of the longest bar.

    Returns
    -------
    list of str
    """
    top = max(max(counts), 1)
    digits = len(str(len(counts) - 1))
    return [
        f"    {k:>{digits}} | {'#' * round(width * c / top):<{width}} {c}"
        for k, c in enumerate(counts)
    ]


def row(label: str, value: str, note: str = "") -> str:
    """An indented ``label  value  (note)`` report line."""
    return f"  {label:<24} {value}" + (f"  ({note})" if note else "")


def print_json(report: dict) -> None:
    """Print *report* as indented JSON on stdout."""
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


def table(header: list[str], rows: list[list[str]], markdown: bool = False) -> list[str]:
    """Lines of a right-aligned text table, or of a Markdown table.

    Parameters
    ----------
    header : list of str
    rows : list of list of str
        Cells, as many per row as *header* has.
    markdown : bool, optional
        A Markdown table (``| a | b |``) instead of aligned columns.

    Returns
    -------
    list of str
    """
    if markdown:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows),
        ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
