"""What a batch worker serves with: :class:`BatchModels`, and the factories that build it.

A worker (a process, a Ray actor) calls its factory once and serves every request
with the models it returns, so a factory must be picklable: a module-level function,
or an instance of a module-level class such as :class:`ModelSpec` (the CLI's
``--model`` and ``--draft``) or :class:`ToyModels` (byte-level n-grams, no download).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec._cores import check_threads

__all__ = ["BatchModels", "ModelSpec", "ToyModels", "plain_chat_format"]

#: Names renamed in 0.3 (old -> new), accepted with a DeprecationWarning until 0.4:
#: "ngram" named both the toy models and the n-gram draft model.
_MODELS = {"ngram": "toy"}
_DRAFTS = {"ngram": "ngram-model"}


def _renamed(where: str, value, renames: dict):
    new = renames.get(value) if isinstance(value, str) else None
    if new is None:
        return value
    warnings.warn(
        f"{where}{value!r} is deprecated since 0.3 and goes in 0.4; use {new!r}",
        DeprecationWarning,
        stacklevel=4,  # the caller of the dataclass's __init__
    )
    return new


@dataclass
class BatchModels:
    """A target, its draft and its tokenizer, as a batch worker uses them.

    Parameters
    ----------
    target : model
        The target (``forward(ids[1, L]) -> logits``).
    draft : model, Drafter, Chain or None
        What drafts (None: plain sampling).  A drafter that carries state between
        requests (``SuffixDrafter``'s memory of earlier outputs) is ``reset()`` before
        each request unless the run is stateful.
    encode : callable
        Text to the ids a completion's prompt is.
    detokenize : callable
        Ids to text.
    name : str
        The model's name in the records (``body.model``).
    encode_chat : callable, optional
        Messages to the ids of a chat prompt; None refuses chat requests.
    stop_ids : list of int
        Ids that end a reply (end of turn, end of sequence); not part of its text.
    context : int, optional
        The most tokens of prompt and completion together; None for no bound.
    """

    target: object
    draft: object
    encode: Callable
    detokenize: Callable
    name: str
    encode_chat: Callable | None = None
    stop_ids: list = field(default_factory=list)
    context: int | None = None


def plain_chat_format(encode: Callable) -> Callable:
    """A chat format for models without a template: ``role: content`` lines, then ``assistant:``.

    Parameters
    ----------
    encode : callable
        Text to ids.

    Returns
    -------
    callable
        ``messages -> ids``.
    """

    def encode_chat(messages) -> list:
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return encode("\n".join([*lines, "assistant:"]))

    return encode_chat


def _drafter(name: str):
    from specdec.drafters import PromptLookup, SuffixDrafter

    return {"lookup": PromptLookup, "suffix": SuffixDrafter}[name]()


@dataclass(frozen=True)
class ToyModels:
    """Byte-level Kneser-Ney n-grams of the standard library's source: models without download.

    The demo's pair (:func:`specdec.toymodels.byte_corpus.load_default_models`, cached
    after the first training).  Chat requests use :func:`plain_chat_format`.

    Parameters
    ----------
    draft : {"lookup", "suffix", "ngram-model", "none"}
        Prompt lookup, suffix trees, the low-order n-gram as a draft model, or nothing
        (``"ngram"``: the old name of ``"ngram-model"``, until 0.4).
    context : int
        The most bytes of prompt and completion per request.
    max_bytes : int, optional
        Training corpus size; smaller trains faster (the tests use 300 kB).
    """

    draft: str = "lookup"
    context: int = 4096
    max_bytes: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "draft", _renamed("ToyModels(draft=)", self.draft, _DRAFTS))

    def __call__(self) -> BatchModels:
        """Build the models (trained, or read from the cache)."""
        from specdec.toymodels import byte_corpus

        kwargs = {} if self.max_bytes is None else {"max_bytes": self.max_bytes}
        draft_model, target = byte_corpus.load_default_models(**kwargs)
        draft = _drafter(self.draft) if self.draft in ("lookup", "suffix") else None
        if self.draft == "ngram-model":
            draft = draft_model
        return BatchModels(
            target,
            draft,
            byte_corpus.encode,
            byte_corpus.decode,
            "toy",
            encode_chat=plain_chat_format(byte_corpus.encode),
            context=self.context,
        )


@dataclass(frozen=True)
class ModelSpec:
    """The models ``specdec batch --model ... --draft ...`` names, built where they run.

    Parameters
    ----------
    model : str
        ``"smollm2"``, a ``.gguf`` path, a Hugging Face directory, or ``"toy"`` (the
        byte-level toy models; ``"ngram"`` until 0.4).
    draft : str
        ``"lookup"``, ``"suffix"``, ``"ngram-model"`` (an n-gram draft model; ``"ngram"``
        until 0.4), ``"none"``, or a model path of the target's kind.
    context : int
        The most tokens of prompt and completion per request (a GGUF's ``n_ctx``).
    threads : int, optional
        The models' threads (llama.cpp's ``n_threads`` and ``n_threads_batch``,
        torch's threads); None: every core the process may use.  Workers that share
        a machine should share its cores: ``specdec batch --workers N`` gives each
        ``cores // N``.
    """

    model: str = "smollm2"
    draft: str = "lookup"
    context: int = 4096
    threads: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "model", _renamed("ModelSpec(model=)", self.model, _MODELS))
        object.__setattr__(self, "draft", _renamed("ModelSpec(draft=)", self.draft, _DRAFTS))
        check_threads(self.threads, "threads")

    def __call__(self) -> BatchModels:
        """Load the models (raises ``specdec.cli.options.CLIError`` with a hint on failure)."""
        if self.model == "toy":
            return ToyModels(self.draft, self.context)()
        from specdec.cli import demo_models, generate

        named = self.draft in ("lookup", "suffix", "ngram-model", "none")
        if self.model == "smollm2" or self.model.endswith(".gguf"):
            spec = self.draft if self.draft == "ngram-model" or not named else "lookup"
            models = demo_models.load_llama_models(
                self.model, spec, True, self.context, self.threads
            )
            target = models.target
            draft = models.draft if self.draft == "ngram-model" or not named else None
        else:
            target = generate._load_transformers(self.model, threads=self.threads)
            draft = (
                None if named else generate._load_transformers(self.draft, "--draft", self.threads)
            )
        if self.draft in ("lookup", "suffix"):
            draft = _drafter(self.draft)
        template = getattr(target, "chat_template", None) is not None
        return BatchModels(
            target,
            draft,
            lambda text: target.tokenize(text, add_bos=True),
            target.detokenize,
            self.model,
            encode_chat=target.encode_chat if template else None,
            stop_ids=list(target.stop_token_ids if template else [target.eos_token_id]),
            context=self.context,
        )
