"""Chat text for the adapters: the model's own chat template and its end of turn.

* :func:`render_chat_template` renders a chat template (the Jinja2 text a GGUF keeps
  in ``tokenizer.chat_template``, or a Hugging Face tokenizer's) the way Hugging Face
  does: a sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
  a ``tojson`` that keeps non-ASCII text.
* :func:`end_of_turn_id` finds the token that closes an assistant turn by rendering
  one and reading what follows its content (``<|im_end|>`` for ChatML,
  ``<|eot_id|>`` for Llama 3), so generation stops where the template says a turn ends.

Text as tokens come (:class:`~specdec._detokenize.IncrementalDetokenizer`) is not an
adapter's concern: it lives in ``specdec/_detokenize.py``, beside the streams.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable

from specdec.models._optional import import_optional

__all__ = [
    "check_messages",
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
