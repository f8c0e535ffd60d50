"""The kernel layer under a public name, for benchmarks and for callers who drive it.

The decoder and the engine are the usual entry points; this module exposes what sits
beneath them, so that ``bench/`` (and anyone timing or testing the kernels) need not
import specdec's underscore modules:

- :func:`kernels_for` returns the kernel module of a backend (``"cython"``, the
  compiled core, or ``"python"``, its pure-Python twin); :func:`available_backends`
  lists those that load, and ``KERNEL_FUNCTIONS`` names the functions both define;
- ``LAW_DTYPE`` is the record type of a row's law (``np.zeros(n, LAW_DTYPE)``);
- :class:`SamplingControls` holds the validated temperature / top-k / top-p / min-p;
- :class:`InvalidLogitsError` is what the kernels raise on unusable logits.
"""

from specdec._backend import KERNEL_FUNCTIONS, available_backends, kernels_for
from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._validation import SamplingControls

__all__ = [
    "KERNEL_FUNCTIONS",
    "LAW_DTYPE",
    "InvalidLogitsError",
    "SamplingControls",
    "available_backends",
    "kernels_for",
]
