"""How the decoder's cost is measured: one harness for ``specdec bench`` and ``bench/``.

A measured run is a zero-argument callable returning an :class:`Outcome`: its
wall time, the decoder's own share of it (everything that is not a model
call) and its statistics.  :func:`specdec_run` and :func:`reference_run`
build them, the same way for the command and for the pytest-benchmark suites,
so the two report the same quantity:

* specdec: ``stats.decoder_time`` (wall time minus the time inside the
  models' ``forward``, measured by the decoder itself);
* the reference loop: the same definition, measured here: both models are
  wrapped in :class:`TimedModel`, and their time is subtracted from the wall
  time of ``generate``.

The reference loop is never part of the package: it is loaded from a file the
caller names (:func:`load_reference`).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import specdec

__all__ = [
    "Outcome",
    "TimedModel",
    "load_reference",
    "specdec_run",
    "reference_run",
    "measure",
    "summary",
]


@dataclass
class Outcome:
    """What one timed ``generate`` call gives.

    Attributes
    ----------
    wall : float
        Seconds for the whole call.
    decoder : float
        Seconds outside the models' ``forward``.
    stats : object
        The call's statistics (specdec's or the reference's).
    tokens : int
        Tokens generated.
    """

    wall: float
    decoder: float
    stats: object
    tokens: int


class TimedModel:
    """Wraps a model and adds up the time spent in its ``forward``.

    Used for the reference loop, which does not measure its own split.  It
    asks for every row (``forward(ids)``), as the reference does.

    Parameters
    ----------
    model : object
        A model with ``forward(ids)``.
    """

    def __init__(self, model):
        self.model = model
        self.vocab_size = getattr(model, "vocab_size", None)
        self.elapsed = 0.0

    def forward(self, ids):
        """The wrapped model's ``forward(ids)``, timed."""
        start = time.perf_counter()
        try:
            return self.model.forward(ids)
        finally:
            self.elapsed += time.perf_counter() - start


def load_reference(path: str | os.PathLike):
    """Import the reference implementation from a file.

    Parameters
    ----------
    path : path-like
        A Python file defining ``SpeculativeDecoder``.

    Returns
    -------
    module
        The loaded module (not added to ``sys.modules``).

    Raises
    ------
    ImportError
        If the file cannot be loaded, fails at import (including by calling
        ``sys.exit``), or defines no ``SpeculativeDecoder``.
    """
    path = Path(path)
    spec = importlib.util.spec_from_file_location("_specdec_reference", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exit_:
        # Someone else's file must not end this process.
        raise ImportError(f"{path} called sys.exit({exit_.code!r}) when imported") from None
    except Exception as error:
        raise ImportError(f"{path} failed when imported: {type(error).__name__}: {error}") from None
    if not hasattr(module, "SpeculativeDecoder"):
        raise ImportError(f"{path} defines no SpeculativeDecoder")
    return module


def specdec_run(
    draft,
    target,
    prompt,
    max_new_tokens: int,
    gamma: int,
    *,
    seed: int = 0,
    backend: str | None = None,
    temperature: float = 1.0,
    **controls,
) -> Callable[[], Outcome]:
    """One specdec ``generate`` call, ready to time.

    Every call starts a fresh random stream from *seed*, so that repeats do
    the same work and differ only in the machine's noise.

    Parameters
    ----------
    draft, target : object
        The models.
    prompt : list of int
    max_new_tokens, gamma : int
    seed : int, optional
    backend : {"cython", "python"}, optional
    temperature : float, optional
    **controls
        ``top_k``, ``top_p``, ``min_p``, ``verification``: passed to the decoder.

    Returns
    -------
    callable
        ``run() -> Outcome``.
    """
    decoder = specdec.SpeculativeDecoder(gamma, temperature, backend=backend, **controls)

    def run() -> Outcome:
        rng = np.random.default_rng(seed)
        start = time.perf_counter()
        ids, stats = decoder.generate(draft, target, prompt, max_new_tokens, rng=rng)
        wall = time.perf_counter() - start
        return Outcome(wall, stats.decoder_time, stats, len(ids) - len(prompt))

    return run


def reference_run(
    module,
    draft,
    target,
    prompt,
    max_new_tokens: int,
    gamma: int,
    *,
    seed: int = 0,
    temperature: float = 1.0,
) -> Callable[[], Outcome]:
    """One call of the reference loop's ``generate``, ready to time.

    Parameters
    ----------
    module : module
        From :func:`load_reference`.
    draft, target : object
        The models; they are wrapped in :class:`TimedModel`.
    prompt : list of int
    max_new_tokens, gamma : int
    seed : int, optional
        Seeds NumPy's global generator, which the reference draws from, before
        every call.
    temperature : float, optional

    Returns
    -------
    callable
        ``run() -> Outcome``.
    """
    timed_draft, timed_target = TimedModel(draft), TimedModel(target)
    decoder = module.SpeculativeDecoder(gamma=gamma, temperature=temperature)

    def run() -> Outcome:
        timed_draft.elapsed = timed_target.elapsed = 0.0
        np.random.seed(seed)  # noqa: NPY002 - the reference loop draws from the global state
        start = time.perf_counter()
        ids, stats = decoder.generate(timed_draft, timed_target, list(prompt), max_new_tokens)
        wall = time.perf_counter() - start
        model_time = timed_draft.elapsed + timed_target.elapsed
        return Outcome(wall, wall - model_time, stats, len(ids) - len(prompt))

    return run


def measure(runs: dict, repeats: int, warmup: int = 1) -> dict:
    """Call each run *warmup* times untimed, then *repeats* times, taking turns.

    The implementations take turns, run by run, so that a change in the
    machine's load during the measurement affects them all alike.

    Parameters
    ----------
    runs : dict
        Name to ``run() -> Outcome``.
    repeats : int
    warmup : int, optional

    Returns
    -------
    dict
        Name to the list of its *repeats* outcomes.
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    outcomes = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            outcomes[name].append(run())
    return outcomes


def summary(outcomes: list, stat=statistics.median) -> dict:
    """Per-token figures of a list of outcomes.

    Parameters
    ----------
    outcomes : list of Outcome
    stat : callable, optional
        How the runs are combined (median by default; ``min`` on a shared
        machine, where contention only ever adds time).

    Returns
    -------
    dict
        ``us_per_token`` (wall time), ``us_per_token_runs``,
        ``decoder_us_per_token``, ``acceptance_rate``, ``tokens_per_step``.
    """

    def per_token(seconds, outcome):
        return seconds / max(outcome.tokens, 1) * 1e6

    return {
        "us_per_token": stat(per_token(o.wall, o) for o in outcomes),
        "us_per_token_runs": [per_token(o.wall, o) for o in outcomes],
        "decoder_us_per_token": stat(per_token(o.decoder, o) for o in outcomes),
        "acceptance_rate": stat(o.stats.acceptance_rate for o in outcomes),
        "tokens_per_step": stat(o.stats.tokens_per_step for o in outcomes),
    }
