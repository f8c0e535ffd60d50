"""Text for the adapters: the model's own chat template, and detokenization as tokens come.

* :func:`render_chat_template` renders a chat template (the Jinja2 text a GGUF keeps
  in ``tokenizer.chat_template``, or a Hugging Face tokenizer's) the way Hugging Face
  does: a sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
  a ``tojson`` that keeps non-ASCII text.
* :func:`end_of_turn_id` finds the token that closes an assistant turn by rendering
  one and reading what follows its content (``<|im_end|>`` for ChatML,
  ``<|eot_id|>`` for Llama 3), so generation stops where the template says a turn ends.
* :class:`IncrementalDetokenizer` turns token ids into text as they come, never
  emitting half a UTF-8 character (a token may end inside a multi-byte character)
  and never a wrong space (SentencePiece tokens decode differently alone and in
  context).  It also speaks Hugging Face's streamer protocol (``put``/``end``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from specdec.models._optional import import_optional

__all__ = ["IncrementalDetokenizer", "check_messages", "end_of_turn_id", "render_chat_template"]

_SENTINEL = "\x00specdec-turn-end\x00"


def check_messages(messages) -> list:
    """Check a chat: a non-empty list of ``{"role": str, "content": str}`` dicts.

    Returns
    -------
    list of dict

    Raises
    ------
    TypeError, ValueError
        Naming the message and what was expected.
    """
    if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
        raise TypeError(
            'messages must be a list of {"role": ..., "content": ...} dicts, got '
            f"{type(messages).__name__}"
        )
    messages = list(messages)
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"messages[{i}] must be a dict, got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise TypeError(f"messages[{i}][{key!r}] must be a str, got {message.get(key)!r}")
    return messages


def render_chat_template(
    template: str,
    messages,
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """Render a Jinja2 chat template as Hugging Face's ``apply_chat_template`` does.

    Parameters
    ----------
    template : str
        The template text (a GGUF's ``tokenizer.chat_template``).
    messages : list of dict
        ``{"role": ..., "content": ...}`` messages.
    bos_token, eos_token : str
        The special tokens' text, which templates may write.
    add_generation_prompt : bool, default True
        End with the header of an assistant turn (what the model continues).

    Returns
    -------
    str

    Raises
    ------
    ImportError
        If ``jinja2`` is not installed.
    ValueError
        If the template raises (``raise_exception``) or cannot be parsed.
    """
    jinja2 = import_optional("jinja2", "chat templates", "llama")
    sandbox = import_optional("jinja2.sandbox", "chat templates", "llama", "jinja2")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=check_messages(messages),
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except jinja2.exceptions.TemplateError as error:
        raise ValueError(f"the model's chat template failed: {error}") from None


def end_of_turn_id(
    render: Callable[..., str], tokenize: Callable[[str], list], special_ids=(), is_special=None
) -> int | None:
    r"""The token that ends an assistant turn in a chat template, or None.

    Renders a chat whose assistant turn holds a sentinel and tokenizes what the
    template writes right after it, whitespace skipped (a template may write
    ``content + '\n<|eot|>\n'``, and a newline ends no turn).  When the tokenizer's
    special tokens are known (``special_ids`` or ``is_special``), the first special
    token there closes the turn, and a template that writes none there has no end of
    turn (a plain-text token would stop the reply wherever that text appears);
    otherwise the first token does.

    Parameters
    ----------
    render : callable
        ``render(messages, add_generation_prompt=...) -> str`` with the model's template.
    tokenize : callable
        ``tokenize(text) -> list of int``, parsing special tokens, adding none.
    special_ids : collection of int, optional
        Ids known to be special (control) tokens.
    is_special : callable, optional
        ``is_special(id) -> bool``, for a tokenizer that says it token by token
        (llama.cpp's token attributes) rather than as a set.

    Returns
    -------
    int or None
    """
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = render(chat, add_generation_prompt=False)
    except Exception:  # a template that refuses this chat (Jinja2's or HF's error): no probe
        return None
    cut = text.rfind(_SENTINEL)
    if cut < 0:
        return None
    after = text[cut + len(_SENTINEL) :].lstrip()
    if not after:
        return None
    ids = [int(t) for t in tokenize(after)]
    if not ids:
        return None
    if is_special is None and special_ids:
        special = frozenset(int(t) for t in special_ids)
        is_special = special.__contains__
    if is_special is None:
        return ids[0]
    return next((t for t in ids if is_special(t)), None)


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
        invalid UTF-8 with U+FFFD.
    on_text : callable, optional
        ``on_text(str)`` for each non-empty piece, when used as a streamer.
    stop_ids : collection of int, optional
        Tokens whose text is never emitted (the end-of-turn token).

    Attributes
    ----------
    text : str
        Everything emitted so far.
    """

    def __init__(self, detokenize: Callable[[list], str], on_text=None, stop_ids=()):
        self._detokenize = detokenize
        self._on_text = on_text
        self._stop_ids = frozenset(int(t) for t in stop_ids)
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text has been emitted
        self._ahead = 0  # characters emitted past ``_read`` (before an unfinished one)
        self._prompt_seen = False
        self.text = ""

    def push(self, ids) -> str:
        """Add tokens; return the text they completed (maybe empty)."""
        self._ids.extend(int(t) for t in ids if int(t) not in self._stop_ids)
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
        """Streamer protocol: skip the prompt, then emit each pass's text."""
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
