"""Decoder cost per generated token: reference loop vs pure-Python vs compiled backend.

Every cell runs ``generate`` with zero-cost table models
(``specdec.toymodels.tables.make_pair``: a draft and a target whose per-token acceptance
probability is calibrated to about 0.5 or 0.8) at temperature 1, for ``MAX_NEW_TOKENS``
new tokens after a 16-token prompt, over V in {32,000, 128,256} and gamma in {4, 8}, and
at V = 64 (gamma 4, acceptance 0.8), where the kernels cost next to nothing and
``decoder_us_per_step`` is the Python around them.
One pytest-benchmark round is one whole ``generate`` call; every round starts from the
same seed, so all rounds of a cell make the same decisions and do the same work.

Recorded in ``extra_info`` (``summarize.py`` turns it into tables):

* ``decoder_us_per_token``: median over the rounds (``_min``: minimum) of the time
  outside the models per generated token (see ``conftest.py``: specdec's
  ``stats.decoder_time``; for the reference loop, wall time minus the time inside the
  models' ``forward``, measured by wrapping them);
* ``acceptance_rate`` and ``tokens_per_step`` actually achieved (they differ between
  implementations only through their random streams: the reference draws from
  NumPy's global state, specdec from a seeded Generator);
* for every cell, the "per step vs np.exp" comparison: ``decoder_us_per_step``
  against ``np_exp_us_per_step``, the time of ``np.exp`` over as many logits rows as
  a step reads (gamma draft rows plus the accepted + 1 target rows verify uses:
  ``rows_per_step``, which is gamma + tokens_per_step except at a final, shorter
  step), and their ratio ``step_over_np_exp``.  ``np.exp`` is timed between the
  rounds, outside the timed part, over table rows at moving positions, into a
  preallocated buffer.  The summary shows it for the compiled backend.

The pure-Python backend and the reference loop cost milliseconds per token at
V = 128,256, so they get few rounds; the whole file runs in a few minutes.

Run::

    PYTHONPATH=src python3 -m pytest bench/bench_decoder.py --benchmark-only
"""

from __future__ import annotations

import pytest
from conftest import compiled_impls, run_decoder_cell

VOCAB_SIZES = (32_000, 128_256)
ACCEPTANCES = (0.5, 0.8)
GAMMAS = (4, 8)
# the compiled backend at every SIMD level this CPU runs ("cython" is the best one)
IMPLEMENTATIONS = ("reference", "python", *compiled_impls())

MAX_NEW_TOKENS = 192


def rounds_for(impl: str, vocab_size: int) -> tuple[int, int]:
    """(rounds, warm-up rounds): the slow two cost milliseconds per token."""
    if impl.startswith("cython"):
        return 15, 1
    return (5, 1) if vocab_size <= 32_000 else (3, 1)


# Ordered so that one model pair serves all the cells that use it.
CELLS = [
    pytest.param(v, a, g, impl, id=f"V{v}-a{a}-g{g}-{impl}")
    for v, a, g in [(64, 0.8, 4)]
    + [(v, a, g) for v in VOCAB_SIZES for a in ACCEPTANCES for g in GAMMAS]
    for impl in IMPLEMENTATIONS
]


@pytest.mark.parametrize(("vocab_size", "acceptance", "gamma", "impl"), CELLS)
def test_decoder(benchmark, request, vocab_size, acceptance, gamma, impl):
    reference = request.getfixturevalue("reference") if impl == "reference" else None
    benchmark.group = f"decoder V={vocab_size} gamma={gamma} acceptance={acceptance}"
    rounds, warmup = rounds_for(impl, vocab_size)
    run_decoder_cell(
        benchmark,
        impl,
        vocab_size=vocab_size,
        acceptance=acceptance,
        gamma=gamma,
        max_new_tokens=MAX_NEW_TOKENS,
        rounds=rounds,
        warmup_rounds=warmup,
        reference_module=reference,
        exp_probe=True,
        kind="decoder",
    )
