"""The kernel layer under a public name, for benchmarks and for callers who drive it.

The decoder and the engine are the usual entry points; this module exposes what sits
beneath them, so that ``bench/`` (and anyone timing or testing the kernels) need not
import specdec's underscore modules:

- :func:`kernels_for` returns the kernel module of a backend (``"cython"``, the
  compiled core, or ``"python"``, its pure-Python twin); :func:`available_backends`
  lists those that load, and ``KERNEL_FUNCTIONS`` names the functions both define;
- ``LAW_DTYPE`` is the record type of a row's law (``np.zeros(n, LAW_DTYPE)``);
- :class:`SamplingControls` holds the validated temperature / top-k / top-p / min-p;
- :class:`InvalidLogitsError` is what the kernels raise on unusable logits;
- ``SIMD_LEVEL`` is the SIMD level the compiled kernels run at (``"avx512"``,
  ``"avx2"`` or ``"baseline"``; None on the pure-Python backend), chosen at import and
  forced with ``SPECDEC_SIMD=<level>``; :func:`available_simd_levels` lists the levels
  this CPU and build can run.
"""

from specdec._backend import (
    KERNEL_FUNCTIONS,
    available_backends,
    available_simd_levels,
    kernels_for,
    simd_level,
)
from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._validation import SamplingControls

__all__ = [
    "KERNEL_FUNCTIONS",
    "LAW_DTYPE",
    "InvalidLogitsError",
    "SamplingControls",
    "SIMD_LEVEL",  # noqa: F822 (module __getattr__ below: read when asked for)
    "available_backends",
    "available_simd_levels",
    "kernels_for",
]


def __getattr__(name: str):
    # SIMD_LEVEL is read when asked for: benchmarks and tests switch levels at run time.
    if name == "SIMD_LEVEL":
        return simd_level()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
