"""The ``specdec`` command: an end-to-end demo and the decoder benchmark.

``specdec demo``
    Speculative decoding with real (if small) language models: byte-level
    n-gram models trained on the standard library's source (the default), or
    a GGUF model through llama.cpp.  Prints the text of both runs, whether
    they are identical (temperature 0) or draws from the same law, the
    acceptance statistics and the wall time against plain sampling.

``specdec generate``
    Text from a model (SmolLM2, a GGUF file, a Hugging Face directory, or the
    n-grams), streamed as speculative decoding makes it, with ``--chat`` for the
    model's chat template and ``--compare`` for the speedup over plain sampling.

``specdec batch``
    An OpenAI Batch file (JSONL) served with speculative decoding: resumable,
    in ``--workers`` processes or on a Ray cluster (``--ray``).

``specdec bench``
    The decoder's own cost per generated token, with models that cost
    nothing, for both backends and, given its file, the reference NumPy loop.

All take ``--json`` for a machine-readable report on stdout.  Errors are one
line on stderr (``specdec: error: ...``): exit status 2 for bad options, 1 for
failures, 130 for Ctrl-C; a reader that leaves (``| head``) ends the command
quietly, with status 1.

One module per subcommand (:mod:`.demo`, :mod:`.generate`, :mod:`.bench`), the terminal output
in :mod:`.output`, the option types and bounds in :mod:`.options`, the timing
harness (shared with the suites in ``bench/``) in :mod:`.measure`, and the
models they use beside them.
"""

from __future__ import annotations

import argparse
import os
import sys

import specdec
from specdec.cli import batch, bench, demo, generate
from specdec.cli.options import CLIError
from specdec.cli.output import stderr_line

__all__ = ["main", "build_parser", "PROG"]

PROG = "specdec"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``specdec: error: ...``.

    argparse prints the whole usage before the message; for a command with
    many options that buries the one line that matters.
    """

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the ``specdec`` argument parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = _Parser(prog=PROG, description="Exact speculative decoding with a compiled core.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {specdec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo.configure(
        commands.add_parser(
            "demo",
            help="speculative decoding end to end, beside plain sampling",
            description=(
                "Generate text with speculative decoding and with plain sampling from the same "
                "target; print both texts, whether they are identical (temperature 0) or draws "
                "from the same law, and the wall times.  The default models are byte-level "
                "n-gram models trained on the Python standard library's source (about a "
                "second on the first run, cached afterwards)."
            ),
        )
    )
    generate.configure(
        commands.add_parser(
            "generate",
            help="text from a model as it is made (speculative decoding, streamed)",
            description=(
                "Generate text from a model with speculative decoding and print it as it is "
                "made, then one line of tokens per second, tokens per target pass and drafts "
                "kept (on stderr, with the progress messages).  --chat applies the model's own "
                "chat template; --compare also runs plain sampling and prints the speedup."
            ),
        )
    )
    batch.configure(
        commands.add_parser(
            "batch",
            help="an OpenAI Batch file (JSONL) served, resumable, on all cores or on Ray",
            description=(
                "Serve every request of an OpenAI Batch file (/v1/chat/completions and "
                "/v1/completions lines) and write one OpenAI Batch result per line to the "
                "output, flushed as each finishes.  Rerunning the command resumes; exit status "
                "0 when every request succeeded, 3 when some failed, 1 when the run failed, "
                "2 for bad options or a refused input."
            ),
        )
    )
    bench.configure(
        commands.add_parser(
            "bench",
            help="decoder overhead per token: Python vs compiled backend (and a reference loop)",
            description=(
                "Measure the decoder's own cost per generated token.  The models return views "
                "of precomputed logits tables (they cost nothing); the target's table is "
                "calibrated so that a draft token is accepted with the given probability."
            ),
        )
    )
    return parser


def _tolerant_streams() -> None:
    """Never fail on a character the terminal cannot encode: escape it instead."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass  # not a text file (replaced by a test harness, say): leave it alone


def main(argv=None) -> int:
    """Run the ``specdec`` command.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 1 on a reported failure or a closed
        stdout (quietly), 2 for bad options, 130 when interrupted.
    """
    _tolerant_streams()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and option errors
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        args.validate(args)
        status = args.run(args)
        # Output still in the buffer (a short --json report) would meet a reader that
        # left only at exit, where Python reports it as an ignored exception, status 120.
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        # Progress bars clear themselves on the way out (try/finally), so
        # there is nothing to tidy; 128 + SIGINT is what shells expect.
        return 130
    except CLIError as error:
        stderr_line(f"{PROG}: error: {error}")
        return error.exit_status
    except MemoryError:
        stderr_line(f"{PROG}: error: out of memory (try fewer tokens or a smaller vocabulary)")
        return 1
    except BrokenPipeError:
        # The reader left (``| head``): nothing to report.  As the signal module's docs
        # advise, stdout goes to devnull so that the flush at exit does not fail again,
        # and the status is 1, as for Python's own EPIPE.
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's capture): nothing will flush to a pipe


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
