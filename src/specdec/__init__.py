"""specdec: exact speculative decoding with a compiled hot loop.

A drop-in replacement for a NumPy speculative-sampling loop::

    from specdec import SpeculativeDecoder
    ids, stats = SpeculativeDecoder(gamma=4, temperature=1.0).generate(
        draft_model, target_model, prompt_ids, max_new_tokens=50)

The kernels come from the compiled core (``BACKEND == "cython"``) unless
``SPECDEC_PUREPYTHON=1`` is set or the core was not built (``"python"``).
"""

from specdec._backend import BACKEND, available_backends
from specdec._decoder import SpeculativeDecoder, SpeculativeDecodingStats, sample

__version__ = "0.1.0"

__all__ = [
    "BACKEND",
    "SpeculativeDecoder",
    "SpeculativeDecodingStats",
    "available_backends",
    "sample",
    "__version__",
]
