"""What top-k and top-p cost per generated token, over plain sampling.

The decoder (gamma = 4, temperature 1, a ``make_pair`` draft and target calibrated
to an acceptance of about 0.8 without controls) runs with four sets of controls:
``plain``, ``top_k=50``, ``top_p=0.9`` and both, at V in {32,000, 128,256}, on both
backends.  The reference loop has no top-k or top-p: it runs ``plain`` only, as
the baseline the compiled controls can be held against.

Caveat when reading per-token ratios: the controls change the two laws, hence the
acceptance rate and the tokens per step, hence the number of logits rows the
decoder handles per generated token.  So ``extra_info`` records, besides
``decoder_us_per_token``, ``tokens_per_step`` and ``decoder_ns_per_logit`` (the
decoder time per logit of the rows whose law it computed): the per-logit ratio is
the cost of the controls themselves, the per-token ratio what a user sees.  (All
figures are decoder time, models excluded: see ``conftest.py``.)

Run::

    PYTHONPATH=src python3 -m pytest bench/bench_controls.py --benchmark-only
"""

from __future__ import annotations

import pytest
from conftest import run_decoder_cell

VOCAB_SIZES = (32_000, 128_256)
GAMMA = 4
ACCEPTANCE = 0.8
VARIANTS = {
    "plain": {},
    "top_k": {"top_k": 50},
    "top_p": {"top_p": 0.9},
    "top_k+top_p": {"top_k": 50, "top_p": 0.9},
}

#: New tokens per round: top-p in the pure-Python backend costs tens of ms per token
#: at V = 128,256.
MAX_NEW_TOKENS = {32_000: 128, 128_256: 96}


def rounds_for(impl: str) -> tuple[int, int]:
    """(rounds, warm-up rounds)."""
    return (5, 1) if impl == "cython" else (3, 1)


CELLS = [
    pytest.param(v, variant, impl, id=f"V{v}-{variant}-{impl}")
    for v in VOCAB_SIZES
    for variant in VARIANTS
    for impl in ("reference", "python", "cython")
    if impl != "reference" or variant == "plain"
]


@pytest.mark.parametrize(("vocab_size", "variant", "impl"), CELLS)
def test_controls(benchmark, request, vocab_size, variant, impl):
    reference = request.getfixturevalue("reference") if impl == "reference" else None
    benchmark.group = f"controls V={vocab_size}"
    benchmark.extra_info["variant"] = variant
    rounds, warmup = rounds_for(impl)
    run_decoder_cell(
        benchmark,
        impl,
        vocab_size=vocab_size,
        acceptance=ACCEPTANCE,
        gamma=GAMMA,
        max_new_tokens=MAX_NEW_TOKENS[vocab_size],
        rounds=rounds,
        warmup_rounds=warmup,
        controls=VARIANTS[variant],
        reference_module=reference,
        kind="controls",
    )
