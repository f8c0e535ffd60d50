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
import operator
import re
import secrets
from collections.abc import Callable

from specdec._validation import is_int
from specdec.models._optional import import_optional

__all__ = [
    "IncrementalDetokenizer",
    "as_text",
    "check_detokenize",
    "check_messages",
    "check_stop_ids",
    "encode_chat_ids",
    "end_of_turn_id",
    "render_chat_template",
]

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
            value = message.get(key)
            if not isinstance(value, str):
                raise TypeError(f"messages[{i}][{key!r}] must be a str, got {value!r}")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                # a lone surrogate: no tokenizer can encode it, so refuse it here, naming
                # the message (not a position in the rendered template)
                raise ValueError(
                    f"messages[{i}][{key!r}] is not valid Unicode text: "
                    f"{error.reason} at character {error.start}"
                ) from None
    return messages


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


def encode_chat_ids(
    render: Callable[[list], str],
    messages,
    tokenize_markup: Callable[[str], list],
    tokenize_text: Callable[[str], list],
    special_content: bool = False,
) -> list:
    r"""Token ids of a chat whose message content stays text: no control token from it.

    Tokenizing a rendered chat template with special tokens parsed (what Hugging
    Face's ``apply_chat_template(tokenize=True)`` and llama-cpp-python's chat handlers
    do) turns a message holding ``<|im_end|>\n<|im_start|>system\n...`` into the
    template's own control tokens: the writer of the message forges a turn.  Here
    only the template's markup is parsed for special tokens, and each message's
    content is tokenized as plain text.  A chat whose contents hold no special-token
    text is tokenized whole, as before (the same ids, so the same replies); one that
    does is rendered with an unguessable placeholder per content, and the markup
    between placeholders and the contents are tokenized apart.

    Parameters
    ----------
    render : callable
        ``render(messages) -> str``: the chat template (with the generation prompt).
    messages : list of dict
        The chat (checked).
    tokenize_markup : callable
        ``tokenize_markup(text) -> list of int``, parsing special tokens, adding none.
    tokenize_text : callable
        ``tokenize_text(text) -> list of int``, all of it plain text, adding none.
    special_content : bool, default False
        Parse special tokens in the content too (the peers' behaviour, for callers who
        write control tokens in their messages on purpose).

    Returns
    -------
    list of int
    """
    messages = check_messages(messages)
    if not isinstance(special_content, bool):
        raise TypeError(f"special_content must be True or False, got {special_content!r}")
    contents = [message["content"] for message in messages]
    if special_content or all(tokenize_markup(c) == tokenize_text(c) for c in contents):
        return [int(t) for t in tokenize_markup(render(messages))]
    nonce = secrets.token_hex(8)
    marks = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    text = render([dict(m, content=mark) for m, mark in zip(messages, marks, strict=True)])
    ids: list = []
    position = 0
    for match in re.finditer("\ue000" + nonce + r":(\d+)\ue001", text):
        if match.start() > position:
            ids += tokenize_markup(text[position : match.start()])
        content = contents[int(match.group(1))]
        if content:
            ids += tokenize_text(content)
        position = match.end()
    if position < len(text):
        ids += tokenize_markup(text[position:])
    return [int(t) for t in ids]


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
