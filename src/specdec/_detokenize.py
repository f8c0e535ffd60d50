"""Text of a growing token sequence, emitted as soon as it is final.

:class:`IncrementalDetokenizer` turns token ids into text as they come, never emitting
half a UTF-8 character (a token may end inside a multi-byte character) and never a wrong
space (SentencePiece tokens decode differently alone and in context).  It also speaks
Hugging Face's streamer protocol (``put``/``end``).  :class:`specdec.TextStream` and
the command line use it; :func:`check_detokenize` and :func:`check_stop_ids` check what
users give them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from specdec._validation import is_int

__all__ = ["IncrementalDetokenizer", "as_text", "check_detokenize", "check_stop_ids"]


def check_stop_ids(stop_ids) -> frozenset:
    """Stop token ids: a collection of ints in ``[0, 2**63)``.

    Returns
    -------
    frozenset of int

    Raises
    ------
    TypeError, ValueError
        Naming ``stop_ids`` and what was expected.
    """
    expected = "stop_ids must be a collection of int token ids"
    if isinstance(stop_ids, (str, bytes, bytearray)) or not hasattr(stop_ids, "__iter__"):
        raise TypeError(f"{expected}, got {type(stop_ids).__name__} {stop_ids!r:.80}")
    ids = []
    for i, token in enumerate(stop_ids):
        if not is_int(token):
            raise TypeError(f"{expected}; stop_ids[{i}] is {type(token).__name__} {token!r:.80}")
        if not 0 <= token < 2**63:
            raise ValueError(f"stop_ids[{i}] must be an int in [0, 2**63), got {token}")
        ids.append(int(token))
    return frozenset(ids)


def as_text(piece, name: str = "detokenize") -> str:
    """What a ``detokenize`` returned, as text: ``str`` as is, bytes decoded as UTF-8.

    Invalid or unfinished UTF-8 becomes U+FFFD, as tokenizers' own ``decode`` does, so
    that bytes are streamed exactly as text is (llama.cpp's ``detokenize`` returns
    bytes).

    Raises
    ------
    TypeError
        Anything else, naming ``name``.
    """
    if isinstance(piece, str):
        return piece
    if isinstance(piece, (bytes, bytearray, memoryview)):
        return bytes(piece).decode("utf-8", errors="replace")
    raise TypeError(
        f"{name} must return str or bytes (UTF-8), got {type(piece).__name__} {piece!r:.80}"
    )


def check_detokenize(detokenize):
    """``detokenize`` must be callable (``detokenize(list of int) -> str or bytes``)."""
    if not callable(detokenize):
        raise TypeError(
            "detokenize must be a callable, detokenize(list of int) -> str or bytes, "
            f"got {type(detokenize).__name__} {detokenize!r:.80}"
        )
    return detokenize


class IncrementalDetokenizer:
    """Text of a growing token sequence, emitted as soon as it is final.

    Each :meth:`push` returns the text its tokens completed: up to the character the
    last token ends inside, if it does (the text then ends with U+FFFD), and every
    piece is decoded in the context of the tokens before it, so that the pieces
    concatenate to the text of the whole sequence.  The window decoded each time
    starts one emission back (the "prefix and read offsets" of vLLM and TGI), so the
    cost per token does not grow with the text.

    It is also a streamer (Hugging Face's protocol): ``put(prompt)`` is skipped,
    ``put(ids)`` and ``end()`` call ``on_text`` with each new piece.

    Parameters
    ----------
    detokenize : callable
        ``detokenize(list of int) -> str`` (an adapter's ``detokenize``), replacing
        invalid UTF-8 with U+FFFD, or ``-> bytes`` (UTF-8, as llama.cpp's), decoded
        here the same way.
    on_text : callable, optional
        ``on_text(str)`` for each non-empty piece, when used as a streamer.
    stop_ids : collection of int, optional
        Tokens whose text is never emitted (the end-of-turn token).

    Attributes
    ----------
    text : str
        Everything emitted so far.
    """

    def __init__(self, detokenize: Callable[[list], str | bytes], on_text=None, stop_ids=()):
        self._user_detokenize = check_detokenize(detokenize)
        if on_text is not None and not callable(on_text):
            raise TypeError(f"on_text must be a callable or None, got {type(on_text).__name__}")
        self._on_text = on_text
        self._stop_ids = check_stop_ids(stop_ids)
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text has been emitted
        self._ahead = 0  # characters emitted past ``_read`` (before an unfinished one)
        self._prompt_seen = False
        self.text = ""

    def _detokenize(self, ids: list) -> str:
        return as_text(self._user_detokenize(ids))

    def push(self, ids) -> str:
        """Add tokens; return the text they completed (maybe empty)."""
        try:
            new = [operator.index(t) for t in ids]
        except TypeError:
            raise TypeError(f"ids must be a sequence of int token ids, got {ids!r:.80}") from None
        self._ids.extend(t for t in new if t not in self._stop_ids)
        before = self._detokenize(self._ids[self._prefix : self._read])
        after = self._detokenize(self._ids[self._prefix :])
        start = len(before) + self._ahead
        if after.endswith("\ufffd"):
            # The last token ends inside a character: emit the characters before it,
            # keep the window where it is until the character is complete.
            piece = after[start : len(after.rstrip("\ufffd"))]
            self._ahead += len(piece)
        else:
            piece = after[start:]
            self._prefix, self._read, self._ahead = self._read, len(self._ids), 0
        self.text += piece
        return piece

    def flush(self) -> str:
        """The text still held back (an unfinished character at the very end)."""
        before = self._detokenize(self._ids[self._prefix : self._read])
        piece = self._detokenize(self._ids[self._prefix :])[len(before) + self._ahead :]
        self._prefix = self._read = len(self._ids)
        self._ahead = 0
        self.text += piece
        return piece

    # -- Hugging Face's streamer protocol --

    def put(self, ids) -> None:
        """Streamer protocol: skip the prompt, then emit each pass's text.

        As Hugging Face's streamers, takes ``(1, n)`` tensors (assisted generation
        passes them) and refuses a batch of several sequences.
        """
        if getattr(ids, "ndim", 1) > 1:
            if ids.ndim > 2 or ids.shape[0] != 1:
                raise ValueError(
                    f"ids must hold one sequence, shape (n,) or (1, n), got {tuple(ids.shape)}"
                )
            ids = ids[0]
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        piece = self.push(ids)
        if piece and self._on_text is not None:
            self._on_text(piece)

    def end(self) -> None:
        """Streamer protocol: emit what was held back."""
        piece = self.flush()
        if piece and self._on_text is not None:
            self._on_text(piece)
