"""``specdec generate``: text from a model, printed as it is made.

One run: the prompt (``--prompt`` or stdin, through the model's chat template with
``--chat``), the reply streamed to stdout pass by pass, then one line on stderr
with tokens per second, tokens per target pass and the drafts kept.  ``--compare``
also runs plain sampling on the same target and prints the speedup; ``--json``
prints a report instead of the text.  Progress (model loading, warm-up, the one
measurement of the target's cost curve, all before any timing) goes to stderr, so
stdout holds only the text.  Both runs end at the first stop id; their counts include
the stop token, the text does not.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import specdec
from specdec.cli import demo, demo_models, runs
from specdec.cli.options import (
    DRAFTS,
    MAX_DEFAULT_DRAFT,
    NGRAM_MODEL,
    TOY,
    CLIError,
    UsageError,
    add_model_options,
    add_sampling_options,
    add_threads_option,
)
from specdec.cli.output import one_line, print_json, printable, stderr_line
from specdec.drafters import Drafter, PromptLookup, SuffixDrafter

__all__ = ["configure", "run_generate", "DRAFTS"]

TRANSFORMERS_HINT = 'pip install "cyspecdec[transformers]"'


def configure(parser) -> None:
    """Add the ``generate`` options to its subparser."""
    add_model_options(parser)
    parser.add_argument("--prompt", type=demo._prompt, help="the prompt (default: read from stdin)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="apply the model's chat template (the prompt is one user message) and stop at "
        "its end of turn",
    )
    add_sampling_options(parser, seed_help="random seed")
    add_threads_option(parser)
    parser.add_argument(
        "--backend", choices=("cython", "python"), help=f"kernels (default: {specdec.BACKEND})"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run plain sampling on the same model, at the same thread settings, and "
        "print the speedup",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON report (and not the text as it comes)"
    )
    parser.set_defaults(run=run_generate, validate=_validate)


def _kind(spec: str) -> str:
    if spec in (TOY, "smollm2") or spec.endswith(".gguf"):
        return TOY if spec == TOY else "gguf"
    return "hf"


def _gguf_context(args) -> int:
    # A token is at least one byte; a chat template adds a few hundred tokens at most.
    prompt = len(args.prompt.encode()) if args.prompt is not None else 0
    gamma = args.gamma or MAX_DEFAULT_DRAFT
    return prompt + args.max_new_tokens + gamma + 512


def _validate(args) -> None:
    """Checks that involve several options."""
    kind = _kind(args.model)
    if kind == "gguf" and _gguf_context(args) > demo.MAX_GGUF_CONTEXT:
        raise UsageError(
            f"--prompt and --max-new-tokens need a context of {_gguf_context(args)} tokens; "
            f"GGUF models here allow at most {demo.MAX_GGUF_CONTEXT}"
        )
    if kind == TOY and _gguf_context(args) > demo.MAX_GGUF_CONTEXT:
        # the byte-level demo models have no context of their own: the same stated bound
        raise UsageError(
            f"--prompt and --max-new-tokens need {_gguf_context(args)} tokens (bytes); the "
            f"toy models allow at most {demo.MAX_GGUF_CONTEXT}"
        )
    if args.chat and kind == TOY:
        raise UsageError("--chat needs a model with a chat template (smollm2, FILE.gguf, HF-DIR)")
    draft_is_model = args.draft not in DRAFTS
    if draft_is_model and kind == TOY:
        raise UsageError("--draft FILE.gguf or HF-DIR needs a GGUF or Hugging Face --model")
    if kind == "hf" and args.draft == NGRAM_MODEL:
        raise UsageError("--draft ngram-model is for GGUF and toy models")
    if draft_is_model and _kind(args.draft) != kind:
        raise UsageError("--draft and --model must be of one kind: both GGUF or both HF-DIR")
    if args.prompt is None and sys.stdin.isatty():
        raise UsageError("no prompt: give --prompt TEXT or pipe the prompt on stdin")


@dataclass
class _Loaded:
    target: object
    draft: object  # a model, a drafter, or None for plain sampling
    encode: object  # text -> ids (no template)
    detokenize: object
    eos_token_id: int | None
    description: str


def _load_transformers(path: str, option: str = "--model", threads: int | None = None):
    if not (Path(path) / "config.json").is_file():  # else a page about tokenizer formats
        raise CLIError(f"{option} {path}: no config.json there, so no Hugging Face model")
    torch_hint = f"{option} {path} needs transformers and torch; install them with: "
    try:
        import transformers
    except ImportError:
        raise CLIError(torch_hint + TRANSFORMERS_HINT) from None
    from specdec.models import TransformersModel

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        return TransformersModel(model, tokenizer=tokenizer, n_threads=threads)
    except (OSError, ValueError, ImportError) as error:
        raise CLIError(f"cannot load {path}: {one_line(error)}") from None


def _load(args) -> _Loaded:
    """The target and the draft the options name (announced on stderr)."""
    kind = _kind(args.model)
    stderr_line(f"loading {args.model}...")
    named = args.draft in DRAFTS
    if kind == TOY:
        models = demo_models.load_toy_models(quiet=False)
        target, eos, encode, detokenize = models.target, None, models.encode, models.decode
        draft = models.draft if args.draft == NGRAM_MODEL else None
        description = "toy byte-level n-gram models of the stdlib"
    elif kind == "gguf":
        context = _gguf_context(args)
        draft_spec = "lookup" if named and args.draft != NGRAM_MODEL else args.draft
        models = demo_models.load_llama_models(args.model, draft_spec, False, context, args.threads)
        target, eos, detokenize = models.target, models.eos_token_id, models.target.detokenize
        draft = models.draft if args.draft == NGRAM_MODEL or not named else None
        encode = lambda text: target.tokenize(text, add_bos=True)  # noqa: E731
        description = models.description
    else:
        target = _load_transformers(args.model, threads=args.threads)
        eos, detokenize = target.eos_token_id, target.detokenize
        encode = target.tokenize
        draft = None if named else _load_transformers(args.draft, "--draft", args.threads)
        description = f"{args.model} (transformers)"
    if args.draft == "lookup":
        draft = PromptLookup()
    elif args.draft == "suffix":
        draft = SuffixDrafter()
    return _Loaded(target, draft, encode, detokenize, eos, description)


def _prompt_ids(args, loaded: _Loaded) -> tuple[list, list]:
    """The prompt's ids and the stop ids (end of turn first)."""
    text = args.prompt
    if args.chat:
        try:
            ids = loaded.target.encode_chat([{"role": "user", "content": text}])
        except ValueError as error:
            raise CLIError(str(error)) from None
        return ids, loaded.target.stop_token_ids
    return loaded.encode(text), [] if loaded.eos_token_id is None else [loaded.eos_token_id]


def _check_context(args, loaded: _Loaded, prompt: list) -> None:
    """A Hugging Face model's prompt and reply must fit in its positions (its config's)."""
    config = getattr(getattr(loaded.target, "model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    need = len(prompt) + args.max_new_tokens + (args.gamma or MAX_DEFAULT_DRAFT) + 1
    if isinstance(limit, int) and need > limit:
        raise UsageError(
            f"the prompt ({len(prompt)} tokens) and --max-new-tokens need {need} positions; "
            f"{args.model} has {limit}"
        )


def _write(piece: str) -> None:
    sys.stdout.write(printable(piece))
    sys.stdout.flush()


def _gamma(args, loaded) -> int:
    """The most draft tokens per pass, as the decoder takes them (0 with no draft)."""
    if loaded.draft is None:
        return 0
    return specdec.SpeculativeDecoder(args.gamma).max_draft_tokens(loaded.draft)


def _run_once(args, loaded, prompt, stops, controls, show):
    """One generation; returns (new ids, stats, seconds), printing the text if ``show``.

    Both paths, plain and speculative, go through a :class:`TextStream`, which ends the
    text at the first of the stop ids (the loops themselves take one).
    """
    backend = args.backend or specdec.BACKEND
    eos = stops[0] if stops else None
    if hasattr(loaded.target, "reset"):
        loaded.target.reset()  # every run pays for its prompt
    start = time.perf_counter()
    if loaded.draft is None:
        tokens = runs.plain_stream(
            loaded.target, prompt, args.max_new_tokens, eos, controls, args.seed, backend
        )
    else:
        decoder = specdec.SpeculativeDecoder(
            args.gamma, seed=args.seed, backend=backend, **controls
        )
        tokens = decoder.stream(loaded.draft, loaded.target, prompt, args.max_new_tokens, eos)
    new, stats = runs.text_of(tokens, loaded.detokenize, stops, _write if show else None)
    return new, stats, time.perf_counter() - start


def _thread_settings(target) -> dict:
    """The threads the target runs on, read back from it (empty for the n-gram models)."""
    llama = getattr(target, "llama", None)
    if llama is not None:
        return {"n_threads": llama.n_threads, "n_threads_batch": llama.n_threads_batch}
    torch = getattr(target, "_torch", None)
    return {} if torch is None else {"torch_threads": torch.get_num_threads()}


def _rate(stats, seconds: float) -> float:
    return stats.total_tokens_generated / seconds if seconds > 0 else 0.0


def _summary(stats, seconds: float) -> str:
    n = stats.total_tokens_generated
    line = (
        f"{n} tokens in {seconds:.2f} s: {_rate(stats, seconds):.1f} tokens/s, "
        f"{stats.tokens_per_step:.2f} tokens per target pass"
    )
    if stats.total_draft_tokens_proposed:
        line += (
            f", {stats.total_draft_tokens_accepted} of {stats.total_draft_tokens_proposed} "
            f"drafts kept ({stats.acceptance_rate:.0%})"
        )
    else:
        line += ", nothing drafted"
    return line


def _read_stdin() -> str:
    """The prompt piped on stdin; a usage error unless it is UTF-8 (the tokenizers need it)."""
    try:
        text = sys.stdin.read()
        text.encode("utf-8")
    except UnicodeDecodeError as error:  # a strict stdin (PYTHONIOENCODING=utf-8:strict)
        byte = error.object[error.start]
        raise UsageError(f"the prompt on stdin is not UTF-8 text (byte 0x{byte:02x})") from None
    except UnicodeEncodeError as error:  # the usual: undecodable bytes kept as surrogates
        byte = ord(error.object[error.start]) - 0xDC00
        where = f"byte 0x{byte:02x} after character {error.start}"
        if not 0x80 <= byte <= 0xFF:
            where = f"character {error.start}"
        raise UsageError(f"the prompt on stdin is not UTF-8 text ({where})") from None
    return text


def run_generate(args) -> int:
    """Run ``specdec generate`` (see :func:`configure` for the options).

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    int
        Exit status.
    """
    if args.prompt is None:
        args.prompt = _read_stdin()
        _validate(args)  # the context it needs
    if not args.prompt:
        raise UsageError("the prompt is empty: the first token needs a prompt to follow")
    loaded = _load(args)
    prompt, stops = _prompt_ids(args, loaded)
    _check_context(args, loaded, prompt)
    controls = dict(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p
    )
    try:
        stderr_line("warming up (the first calls page the weights in)...")
        specdec.sample(loaded.target, prompt, 1, temperature=0.0, backend=args.backend)
        if loaded.draft is not None and not isinstance(loaded.draft, Drafter):
            specdec.sample(loaded.draft, prompt, 1, temperature=0.0, backend=args.backend)
        if loaded.draft is not None:  # only a speculative run reads the cost curve
            runs.calibrate(loaded.target, quiet=False)
        show = not args.json
        try:
            new, stats, seconds = _run_once(args, loaded, prompt, stops, controls, show)
        finally:
            if show:
                sys.stdout.write("\n")
                sys.stdout.flush()
        stderr_line(_summary(stats, seconds))
        plain = None
        if args.compare:
            plain_loaded = _Loaded(**{**vars(loaded), "draft": None})
            plain = _run_once(args, plain_loaded, prompt, stops, controls, False)
            speedup = _rate(stats, seconds) / max(_rate(plain[1], plain[2]), 1e-9)
            settings = ", ".join(f"{k}={v}" for k, v in _thread_settings(loaded.target).items())
            stderr_line(
                f"plain sampling (the same model{', ' + settings if settings else ''}): "
                f"{_summary(plain[1], plain[2])}; speculative decoding made "
                f"{speedup:.2f}x as many tokens per second"
            )
    except (ValueError, ImportError) as error:
        raise CLIError(str(error)) from None
    if args.json:
        report = {
            "specdec_version": specdec.__version__,
            "model": args.model,
            "description": loaded.description,
            "draft": args.draft,
            "chat": args.chat,
            "settings": {
                "max_new_tokens": args.max_new_tokens,
                "gamma": _gamma(args, loaded),  # the effective value, also when not given
                "seed": args.seed,
            }
            | controls
            | _thread_settings(loaded.target),
            "prompt_tokens": len(prompt),
            "text": loaded.detokenize(new),
            "ids": [int(t) for t in new],
            "seconds": seconds,
            "tokens_per_second": _rate(stats, seconds),
            "stats": demo._stats_dict(stats, seconds),
        }
        if plain is not None:
            report["plain"] = demo._stats_dict(plain[1], plain[2])
            report["speedup"] = speedup
        print_json(report)
    return 0
