"""``specdec bench``: the decoder's own cost per generated token.

The models return views of precomputed logits tables (:mod:`specdec.toymodels.tables`),
so a run's wall time is the decoder's; the runs are timed by :mod:`.measure`,
the harness the pytest-benchmark suites in ``bench/`` use as well.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np

import specdec
from specdec import measure
from specdec.cli.options import (
    MAX_GAMMA,
    MAX_REPEATS,
    MAX_SEED,
    MAX_VOCAB,
    CLIError,
    UsageError,
    add_max_new_tokens,
    format_bytes,
    memory_budget,
    number,
)
from specdec.cli.output import Progress, print_json, stderr_line, table
from specdec.toymodels import tables

__all__ = ["configure", "run_bench", "REFERENCE_ENV"]

#: Environment variable naming the reference loop's file (``--reference`` wins).
REFERENCE_ENV = "SPECDEC_REFERENCE"
_COLUMNS = {"reference": "reference", "python": "python", "cython": "compiled"}
_PROMPT = list(range(16))


def configure(bench) -> None:
    """Add the ``bench`` options to its subparser."""
    bench.add_argument(
        "--vocab",
        type=number(int, lo=2, hi=MAX_VOCAB, what=f"an integer in [2, {MAX_VOCAB}]"),
        nargs="+",
        default=[32000, 128256],
        metavar="V",
        help="vocabulary sizes (default: 32000 128256)",
    )
    bench.add_argument(
        "--gamma",
        type=number(int, lo=1, hi=MAX_GAMMA, what=f"an integer in [1, {MAX_GAMMA}]"),
        nargs="+",
        default=[4, 8],
        metavar="G",
        help="draft lengths (default: 4 8)",
    )
    bench.add_argument(
        "--acceptance",
        type=number(float, lo=0.0, hi=1.0, lo_open=True, hi_open=True, what="a number in (0, 1)"),
        nargs="+",
        default=[0.5, 0.8],
        metavar="A",
        help="per-token acceptance probabilities, sum(min(p, q)) (default: 0.5 0.8)",
    )
    add_max_new_tokens(bench, 128, "tokens per run")
    bench.add_argument(
        "--repeats",
        metavar="N",
        type=number(int, lo=1, hi=MAX_REPEATS, what=f"an integer in [1, {MAX_REPEATS}]"),
        default=3,
        help="timed runs per cell; the median is reported (default: %(default)s)",
    )
    bench.add_argument(
        "--seed",
        metavar="N",
        type=number(int, lo=0, hi=MAX_SEED, what="an integer in [0, 2**32)"),
        default=0,
        help="seed of the tables and of every run's random stream (default: %(default)s)",
    )
    bench.add_argument(
        "--reference",
        metavar="PATH",
        help="a reference speculative_decoding.py to measure as well (default: "
        f"${REFERENCE_ENV} if set, else no reference column)",
    )
    bench.add_argument(
        "--no-reference",
        action="store_true",
        help=f"skip the reference column (ignore ${REFERENCE_ENV})",
    )
    bench.add_argument(
        "--backend",
        choices=("cython", "python"),
        nargs="+",
        dest="backends",
        help="backends to measure (default: every backend this installation has)",
    )
    bench.add_argument(
        "--plot", metavar="FILE.png", help="plot us/token against V (needs matplotlib)"
    )
    out = bench.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print a JSON report and nothing else on stdout"
    )
    out.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    bench.set_defaults(run=run_bench, validate=_validate)


def _table_rows(args) -> int:
    return len(_PROMPT) + args.max_new_tokens + max(args.gamma) + 1


def _validate(args) -> None:
    """Refuse, before any work, a run whose tables cannot fit in memory."""
    need = tables.pair_bytes(max(args.vocab), _table_rows(args))
    budget = memory_budget()
    if need > budget:
        raise UsageError(
            f"--vocab {max(args.vocab)} with --max-new-tokens {args.max_new_tokens} and --gamma "
            f"{max(args.gamma)} needs about {format_bytes(need)} for the logits tables, more "
            f"than the {format_bytes(budget)} allowed (half the memory): use fewer tokens or "
            "a smaller vocabulary"
        )


def _reference_path(args) -> Path | None:
    """The reference file named by ``--reference`` or ``$SPECDEC_REFERENCE``, or None."""
    if args.no_reference:
        return None
    if args.reference:
        source, value = "--reference", args.reference
    elif os.environ.get(REFERENCE_ENV):
        source, value = REFERENCE_ENV, os.environ[REFERENCE_ENV]
    else:
        return None
    path = Path(value)
    if not path.is_file():
        raise CLIError(f"{source}: no such file: {value}")
    return path


def _load_reference(args):
    path = _reference_path(args)
    if path is None:
        return None, None
    try:
        return measure.load_reference(path), path
    except ImportError as error:
        raise CLIError(f"cannot load the reference: {error}") from None


def _guarded(run, name: str):
    """*run*, with any failure of someone else's code reported as a CLIError."""

    def guarded():
        try:
            return run()
        except (Exception, SystemExit) as error:
            what = f"sys.exit({error.code!r})" if isinstance(error, SystemExit) else repr(error)
            raise CLIError(f"the {name}'s generate failed: {what}") from None

    return guarded


def run_bench(args) -> int:
    """Run ``specdec bench`` (see :func:`configure` for the options).

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
    reference, reference_path = _load_reference(args)
    available = specdec.available_backends()
    asked = args.backends or available  # a pure-Python install has no compiled column
    # Fixed column order, compiled last: the ratios and "kept" refer to it.
    backends = [b for b in ("python", "cython") if b in asked and b in available]
    for missing in dict.fromkeys(b for b in asked if b not in available):
        stderr_line(
            f"note: the {missing} backend is not available in this installation; skipping it"
        )
    implementations = (["reference"] if reference else []) + backends
    if not implementations:
        raise CLIError("nothing to measure")

    n_cells = len(args.vocab) * len(args.acceptance) * len(args.gamma)
    bar = Progress("bench", n_cells, delay=0.0, unit="configurations")
    results = []
    try:
        for v in args.vocab:
            for a in args.acceptance:
                try:
                    draft, target, info = tables.make_pair(v, a, _table_rows(args), seed=args.seed)
                except ValueError as error:  # an acceptance these tables cannot reach
                    raise UsageError(
                        f"--acceptance {a:g} --vocab {v}: {error} (tables over so few tokens "
                        "agree more often than that: use a larger --vocab or a higher --acceptance)"
                    ) from None
                for g in args.gamma:
                    bar.label = f"bench V={v} acceptance={a:g} gamma={g}"
                    bar.update(len(results))
                    runs = {}
                    if reference is not None:
                        runs["reference"] = _guarded(
                            measure.reference_run(
                                reference,
                                draft,
                                target,
                                _PROMPT,
                                args.max_new_tokens,
                                g,
                                seed=args.seed,
                            ),
                            "reference",
                        )
                    for backend in backends:
                        runs[backend] = measure.specdec_run(
                            draft,
                            target,
                            _PROMPT,
                            args.max_new_tokens,
                            g,
                            seed=args.seed,
                            backend=backend,
                        )
                    outcomes = measure.measure(runs, args.repeats)
                    cell = {"vocab_size": v, "gamma": g, "acceptance": a}
                    cell["acceptance_calibrated"] = info["acceptance"]
                    cell["results"] = {n: measure.summary(o) for n, o in outcomes.items()}
                    cell["ratios"] = _ratios(cell["results"])
                    results.append(cell)
                del draft, target  # two V-wide tables: free them before building the next pair
    finally:
        bar.close()

    report = {
        "specdec_version": specdec.__version__,
        "settings": {
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "seed": args.seed,
            "prompt_tokens": len(_PROMPT),
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
        print_json(report)
    else:
        _print_table(results, implementations, args.markdown)
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0


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


def _fmt_us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _print_table(results, implementations, markdown: bool) -> None:
    header = ["V", "gamma", "accept", "kept"] + [f"{_COLUMNS[n]} us/tok" for n in implementations]
    ratios = [k for k in ("reference/compiled", "python/compiled") if k in results[0]["ratios"]]
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
    print("\n".join(table(header, rows, markdown)))
    print()
    print("us/tok: wall time per generated token with models that cost nothing (median of runs);")
    print("accept: per-token acceptance probability sum(min(p, q)) the tables are calibrated to;")
    print("kept: fraction of proposed drafts kept (drafts after a rejection are discarded).")


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
    for r, g in enumerate(gammas):
        for c, a in enumerate(acceptances):
            ax = axes[r][c]
            cells = sorted(
                (cell for cell in results if (cell["gamma"], cell["acceptance"]) == (g, a)),
                key=lambda cell: cell["vocab_size"],
            )
            for name in implementations:
                ax.plot(
                    [cell["vocab_size"] for cell in cells],
                    [cell["results"][name]["us_per_token"] for cell in cells],
                    marker="o",
                    label=_COLUMNS[name],
                )
            ax.set(xscale="log", yscale="log", title=f"gamma = {g}, acceptance = {a:g}")
            ax.grid(True, which="both", alpha=0.3)
            if r == len(gammas) - 1:
                ax.set_xlabel("vocabulary size V")
            if c == 0:
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
