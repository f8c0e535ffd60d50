"""``specdec batch``: an OpenAI Batch file served, resumable, on all cores or on Ray.

Reads every line first (a duplicate ``custom_id`` refuses the file), skips the
requests already in the output, serves the others in this process, in ``--workers``
processes or on Ray (``--ray``), and appends each record as it finishes.  A progress
bar on stderr (on a terminal) shows requests done, tokens per second and drafts kept.

Exit status: 0 when every request has a successful record, 3 when some failed (their
records say why; ``--retry-failed`` runs them again), 1 when the run itself failed
(models that do not load, a worker that died: rerun to resume), 2 for bad options or
an input refused before any work, 130 when interrupted.
"""

from __future__ import annotations

import time
from pathlib import Path

import specdec
from specdec.batch.job import run_batch
from specdec.batch.models import ModelSpec
from specdec.batch.requests import DuplicateCustomId
from specdec.batch.runner import BatchOptions
from specdec.cli.options import (
    DRAFTS,
    NGRAM_MODEL,
    TOY,
    CLIError,
    UsageError,
    add_model_options,
    add_sampling_options,
    add_threads_option,
    number,
)
from specdec.cli.output import Progress, one_line, stderr_line

__all__ = ["configure", "run_batch_command", "EXIT_SOME_FAILED"]

#: Exit status when the run finished but some requests got error records.
EXIT_SOME_FAILED = 3
MAX_WORKERS = 1024
MAX_CONTEXT = 1 << 20


def configure(parser) -> None:
    """Add the ``batch`` options to its subparser."""
    parser.add_argument("input", metavar="INPUT.jsonl", help="OpenAI Batch requests, one a line")
    parser.add_argument(
        "-o", "--output", metavar="OUTPUT.jsonl", required=True,
        help="results, one a line; an existing file is resumed (its requests are skipped)",
    )  # fmt: skip
    add_model_options(parser)
    add_sampling_options(
        parser,
        seed_help="the run's seed: a request without body.seed gets a seed derived from it "
        "and its custom_id",
    )
    parser.add_argument(
        "--context",
        metavar="N",
        type=number(int, lo=16, hi=MAX_CONTEXT, what=f"an integer in [16, {MAX_CONTEXT}]"),
        default=4096,
        help="the most tokens of prompt and completion per request; longer requests fail "
        "with status 400 (default: %(default)s)",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        type=number(int, lo=1, hi=MAX_WORKERS, what=f"an integer in [1, {MAX_WORKERS}]"),
        default=1,
        help="worker processes, each loading the models once; with --ray, Ray actors "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=False,
        metavar="ADDRESS",
        help="serve on a Ray cluster: ADDRESS, else $RAY_ADDRESS, else one started on this "
        "machine by 'ray start', else a new local one (needs cyspecdec[ray])",
    )
    add_threads_option(
        parser, "every usable core; with --workers N, cores // N each; one per Ray actor"
    )
    parser.add_argument(
        "--retry-failed", action="store_true", help="run the requests whose records failed again"
    )
    parser.add_argument(
        "--stateful",
        action="store_true",
        help="carry drafting state between requests (the draft-length policy's learning, "
        "suffix trees of earlier outputs, the measured cost curve): faster on repetitive "
        "work, but a sampled request's output then depends on what ran before it",
    )
    parser.add_argument(
        "--backend", choices=("cython", "python"), help=f"kernels (default: {specdec.BACKEND})"
    )
    parser.set_defaults(run=run_batch_command, validate=_validate)


def _kind(spec: str) -> str:
    if spec == TOY:
        return TOY
    return "gguf" if spec == "smollm2" or spec.endswith(".gguf") else "hf"


def _validate(args) -> None:
    kind = _kind(args.model)
    draft_is_model = args.draft not in DRAFTS
    if draft_is_model and kind == TOY:
        raise UsageError("--draft FILE.gguf or HF-DIR needs a GGUF or Hugging Face --model")
    if kind == "hf" and args.draft == NGRAM_MODEL:
        raise UsageError("--draft ngram-model is for GGUF and toy models")
    if draft_is_model and _kind(args.draft) != kind:
        raise UsageError("--draft and --model must be of one kind: both GGUF or both HF-DIR")
    if not Path(args.input).is_file():
        raise UsageError(f"no such input file: {args.input}")
    if Path(args.output).is_dir():
        raise UsageError(f"the output {args.output} is a directory")


class _BatchProgress:
    """The bar: requests done, tokens per second, drafts kept (drawn only on a terminal)."""

    def __init__(self):
        self.bar = Progress("batch", 0, unit="requests")
        self.start = time.perf_counter()
        self.done = self.tokens = self.drafted = self.kept = 0

    def start_run(self, summary) -> None:
        """The requests left to serve are known (the output was read)."""
        self.bar.total = summary.requests - summary.skipped
        self.start = time.perf_counter()

    def __call__(self, record: dict) -> None:
        self.done += 1
        body = record["response"]["body"]
        if record["response"]["status_code"] == 200:
            self.tokens += body["usage"]["completion_tokens"]
            self.drafted += body["specdec"]["drafted"]
            self.kept += body["specdec"]["drafts_kept"]
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        kept = f", {self.kept / self.drafted:.0%} drafts kept" if self.drafted else ""
        self.bar.unit = f"requests, {rate:.1f} tokens/s{kept}"
        self.bar.update(self.done)


def run_batch_command(args) -> int:
    """Run ``specdec batch`` (see :func:`configure` for the options).

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    int
        Exit status (see the module's docstring).
    """
    options = BatchOptions(
        max_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        gamma=args.gamma,
        stateful=args.stateful,
        backend=args.backend,
    )
    factory = ModelSpec(args.model, args.draft, args.context, args.threads)
    if args.ray is not False:
        from specdec.batch.ray_stage import import_ray

        try:
            import_ray()
        except ImportError as error:
            raise CLIError(str(error)) from None
    progress = _BatchProgress()
    try:
        summary = run_batch(
            args.input,
            args.output,
            factory,
            options,
            workers=args.workers,
            ray=args.ray,
            retry_failed=args.retry_failed,
            on_start=progress.start_run,
            on_record=progress,
        )
    except DuplicateCustomId as error:
        raise UsageError(f"{args.input}: {error}") from None
    except (ValueError, OSError, ImportError) as error:
        raise CLIError(one_line(error)) from None
    except RuntimeError as error:  # a worker that died or could not load its models
        raise CLIError(one_line(error)) from None
    finally:
        progress.bar.close()
    stderr_line(
        f"{summary.requests} requests: {summary.written} served now, {summary.skipped} "
        f"already in {args.output}; {summary.failed} failed"
        + (" (--retry-failed runs them again)" if summary.failed else "")
    )
    return 0 if summary.failed == 0 else EXIT_SOME_FAILED
