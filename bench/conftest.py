r"""Shared fixtures of the benchmark suites in ``bench/``.

Run the zero-cost-model suites, then turn the JSON into Markdown tables of ratios::

    python3 setup.py build_ext --inplace -q
    PYTHONPATH=src python3 -m pytest bench/bench_decoder.py bench/bench_kernels.py \
        bench/bench_controls.py --benchmark-only --benchmark-json=/tmp/specdec-bench.json
    python3 bench/summarize.py /tmp/specdec-bench.json

(``pytest bench`` runs every ``bench_*.py``, including the real-model suite, which
``summarize.py`` ignores.)

Speed is measured here, never asserted: the suites compare the reference loop, the
pure-Python backend and the compiled backend *in the same run*, and the summary
quotes ratios rather than absolute times (the machines are small and shared).

This file also makes ``pytest bench`` collect the ``bench_*.py`` modules (the
project's ``python_files`` pattern is ``test_*.py``); a file named on the command
line is collected anyway.

What "decoder time" means
-------------------------
The models are :class:`specdec.toymodels.tables.TableModel` tables: a forward pass is a
slice of a precomputed logits table, so it costs next to nothing.  Still, every
figure labelled *decoder* excludes the models:

* specdec backends: ``stats.decoder_time`` -- the call's wall time minus the time
  spent inside the two models' ``forward`` (specdec measures this itself);
* the reference loop: the same definition -- both models are wrapped in
  :class:`specdec.measure.TimedModel`, which times each ``forward`` call, and
  the sum is subtracted from the wall time of ``generate``.

Both come from :mod:`specdec.measure`, the harness ``specdec bench`` uses too.

The reference loop is ``--reference PATH``, else ``$SPECDEC_REFERENCE``, else
``shared/reference/speculative_decoding.py`` beside the repository; its cells skip
when it is absent.

The wall time per token is recorded as well (``wall_us_per_token``); with these
models the two differ by a few percent at most.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from specdec._backend import _use_simd_level  # private: benchmarks switch levels at run time
from specdec.kernels import available_simd_levels, kernels_for
from specdec.measure import load_reference, reference_run, specdec_run
from specdec.toymodels.tables import make_pair

#: The reference loop, beside the repository: never copied into the project.
DEFAULT_REFERENCE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "speculative_decoding.py"
)

#: Tokens of prompt before the generated ones (the table rows they occupy are unused).
PROMPT = list(range(16))

#: Seed of the tables and of every round's random stream (each round repeats the same
#: decisions, so the rounds of one cell do the same work).
SEED = 0


#: Lines a suite wants printed after the run (``pytest_terminal_summary``).
SUMMARY_LINES: list = []


# --- collection ------------------------------------------------------------------------


def pytest_terminal_summary(terminalreporter):
    """Print the table a suite collected in ``SUMMARY_LINES`` (bench_verification.py)."""
    if SUMMARY_LINES:
        terminalreporter.write_sep("-", "summary")
        for line in SUMMARY_LINES:
            terminalreporter.write_line(line)


def pytest_collect_file(file_path, parent):
    """Collect ``bench_*.py`` under ``bench/`` when the directory is given."""
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and file_path.parent == Path(__file__).parent
        and not parent.session.isinitpath(file_path)  # named explicitly: pytest collects it
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_addoption(parser):
    try:
        parser.addoption(
            "--reference",
            metavar="PATH",
            help="the reference speculative_decoding.py (default: "
            "$SPECDEC_REFERENCE, else shared/reference/ beside the repository)",
        )
    except ValueError:
        pass  # tests/conftest.py, collected in the same run, declares it already


# --- the implementations ---------------------------------------------------------------


def reference_file(config) -> Path:
    """Where the reference loop is: ``--reference``, ``$SPECDEC_REFERENCE`` or the default."""
    named = config.getoption("--reference", None) or os.environ.get("SPECDEC_REFERENCE")
    return Path(named) if named else DEFAULT_REFERENCE


@pytest.fixture(scope="session")
def reference(request):
    """The reference module, or a skip when its file is absent."""
    path = reference_file(request.config)
    if not path.is_file():
        pytest.skip(f"reference loop not found at {path}")
    return load_reference(path)


def kernels_or_fail(backend: str):
    """The kernel module of *backend*; a missing compiled core fails (never a silent skip)."""
    try:
        return kernels_for(backend)
    except ImportError as error:
        pytest.fail(
            f"{error}\nbuild it first: python3 setup.py build_ext --inplace -q", pytrace=False
        )


# --- SIMD levels --------------------------------------------------------------------------
# The compiled core holds its kernels once per SIMD level; the suites time every level
# this CPU runs in one run: "cython" is the default (best) level, "cython@avx2" and
# "cython@baseline" the lower ones, forced as SPECDEC_SIMD would force them.


def compiled_impls() -> tuple[str, ...]:
    """``"cython"`` and ``"cython@<level>"`` for every lower level this CPU runs."""
    return ("cython", *(f"cython@{level}" for level in available_simd_levels()[1:]))


def backend_of(impl: str) -> str:
    """The backend of an implementation name: ``"cython@avx2"`` -> ``"cython"``."""
    return impl.partition("@")[0]


@contextmanager
def simd_level_of(impl: str):
    """Run the body at `impl`'s SIMD level; yields that level (None for non-compiled)."""
    backend, _, level = impl.partition("@")
    if backend != "cython":
        yield None
        return
    kernels_or_fail("cython")
    level = level or available_simd_levels()[0]
    previous = _use_simd_level(level)
    try:
        yield level
    finally:
        _use_simd_level(previous)


# --- the models --------------------------------------------------------------------------

_PAIRS: dict = {}


def model_pair(vocab_size: int, acceptance: float, length: int):
    """``make_pair(vocab_size, acceptance, length, seed=SEED)``, cached.

    At most two pairs stay alive (a pair at V = 128,256 is two tables of about
    75 MB); the suites order their cells so that a pair is reused while it lives.
    """
    key = (vocab_size, acceptance, length)
    if key not in _PAIRS:
        while len(_PAIRS) >= 2:
            _PAIRS.pop(next(iter(_PAIRS)))
        _PAIRS[key] = make_pair(vocab_size, acceptance, length, seed=SEED)
    return _PAIRS[key]


# --- one decoder cell --------------------------------------------------------------------


class ExpProbe:
    """Times ``np.exp`` over table rows, to compare the decoder's cost with.

    Each probe applies ``np.exp(block, out=buffer)`` to ``rows`` consecutive rows of
    the table, at a position that moves on every probe (so the block is not simply
    the one that is hot in cache), into a preallocated buffer (so the yardstick is
    the exponential itself, not an allocation).  ``us_per_row(stat)`` is the median
    (or the minimum) over all probes, per row.
    """

    def __init__(self, table: np.ndarray, rows: int, first: int):
        self.table, self.rows, self.first = table, rows, first
        self.buffer = np.empty((rows, table.shape[1]), dtype=table.dtype)
        self.samples: list[float] = []
        self._position = first

    def probe(self, repeats: int = 5) -> None:
        last = self.table.shape[0] - self.rows
        for _ in range(repeats):
            block = self.table[self._position : self._position + self.rows]
            start = time.perf_counter()
            np.exp(block, out=self.buffer)
            self.samples.append(time.perf_counter() - start)
            self._position += self.rows
            if self._position > last:
                self._position = self.first

    def us_per_row(self, stat=statistics.median) -> float:
        return stat(self.samples) / self.rows * 1e6


def run_decoder_cell(
    benchmark,
    impl: str,
    *,
    vocab_size: int,
    acceptance: float,
    gamma: int,
    max_new_tokens: int,
    rounds: int,
    warmup_rounds: int = 1,
    controls: dict | None = None,
    reference_module=None,
    exp_probe: bool = False,
    kind: str = "decoder",
    verification: str = "token",
) -> dict:
    """Benchmark one ``generate`` call of *impl* and fill ``benchmark.extra_info``.

    Parameters
    ----------
    benchmark
        The pytest-benchmark fixture; its timed rounds are whole ``generate`` calls.
    impl : {"reference", "python", "cython", "cython@<level>"}
        ``"cython@avx2"``: the compiled backend at that SIMD level (``compiled_impls``).
    vocab_size, acceptance, gamma, max_new_tokens
        The cell: a :func:`make_pair` draft and target, temperature 1.
    rounds, warmup_rounds
        As for ``benchmark.pedantic``; every round starts from the same seed.
    controls : dict, optional
        ``top_k`` / ``top_p`` / ``min_p`` for specdec (the reference has none).
    reference_module
        The loaded reference module (required for ``impl="reference"``).
    kind : str
        Recorded as ``extra_info["kind"]``: which table of ``summarize.py`` it feeds.
    verification : {"token", "block"}
        specdec's scheme; "token" by default, the reference loop's own, so that the
        two do the same work per step (bench_verification.py compares the schemes).
    exp_probe : bool
        Also time ``np.exp`` over table rows before each round (outside the timed
        part) and record the per-step comparison.

    Returns
    -------
    dict
        The ``extra_info`` written.
    """
    controls = dict(controls or {})
    length = len(PROMPT) + max_new_tokens
    draft, target, info = model_pair(vocab_size, acceptance, length)
    probe = ExpProbe(target.table, gamma, len(PROMPT)) if exp_probe else None

    if impl == "reference":
        if controls:
            raise ValueError("the reference loop has no top-k / top-p / min-p")
        run = reference_run(
            reference_module, draft, target, PROMPT, max_new_tokens, gamma, seed=SEED
        )
    else:
        kernels_or_fail(backend_of(impl))
        run = specdec_run(
            draft,
            target,
            PROMPT,
            max_new_tokens,
            gamma,
            seed=SEED,
            backend=backend_of(impl),
            verification=verification,
            **controls,
        )

    def setup():
        if probe:
            probe.probe()
        return (), {}

    def once():
        outcomes.append(run())

    outcomes: list = []
    with simd_level_of(impl) as level:
        benchmark.pedantic(once, setup=setup, rounds=rounds, warmup_rounds=warmup_rounds)
    # Drop the warm-up rounds (and any extra calls, e.g. --benchmark-cprofile's).
    timed = [
        (o.wall, o.decoder, o.stats)
        for o in outcomes[warmup_rounds : warmup_rounds + rounds] or outcomes
    ]

    stats = timed[-1][2]  # every round made the same decisions (same seed)
    tokens = stats.total_tokens_generated
    steps = stats.num_target_forward_passes
    # Rows whose law a step computes: the drafts' rows and the target rows verify
    # used (accepted + 1 per step, one fewer at a final step without a bonus).
    rows_per_step = (stats.total_draft_tokens_proposed + tokens) / steps
    extra = {
        "kind": kind,
        "impl": impl,
        "simd_level": level,
        "vocab_size": vocab_size,
        "gamma": gamma,
        "acceptance": acceptance,
        "acceptance_calibrated": round(info["acceptance"], 4),
        "controls": controls,
        "verification": "token" if impl == "reference" else verification,
        "dtype": str(target.table.dtype),
        "max_new_tokens": max_new_tokens,
        "tokens": tokens,
        "target_steps": steps,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_step": stats.tokens_per_step,
        "rows_per_step": rows_per_step,
        "rounds_measured": len(timed),
        "decoder_time_source": (
            "wall minus TimedModel forward time" if impl == "reference" else "stats.decoder_time"
        ),
        "decoder_us_per_token_rounds": [d / tokens * 1e6 for _, d, _ in timed],
    }
    # Headline figures are medians over the rounds; "_min" twins hold the minima (on a
    # shared machine, contention only ever adds time).
    for suffix, stat in (("", statistics.median), ("_min", min)):
        decoder_seconds = stat([d for _, d, _ in timed])
        extra.update(
            {
                f"decoder_us_per_token{suffix}": decoder_seconds / tokens * 1e6,
                f"decoder_us_per_step{suffix}": decoder_seconds / steps * 1e6,
                f"decoder_ns_per_logit{suffix}": decoder_seconds
                / (steps * rows_per_step * vocab_size)
                * 1e9,
                f"wall_us_per_token{suffix}": stat([w for w, _, _ in timed]) / tokens * 1e6,
            }
        )
        if probe:
            exp_row = probe.us_per_row(stat)
            extra.update(
                {
                    f"np_exp_us_per_row{suffix}": exp_row,
                    f"np_exp_us_per_step{suffix}": exp_row * rows_per_step,
                    f"step_over_np_exp{suffix}": extra[f"decoder_us_per_step{suffix}"]
                    / (exp_row * rows_per_step),
                }
            )
    if probe:
        extra["np_exp_probes"] = len(probe.samples)
    benchmark.extra_info.update(extra)
    return extra
