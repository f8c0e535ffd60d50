"""How many threads a model decodes on: the cores this process may use, unless told.

On a quiet machine plain decoding is fastest with every usable core for one-token
passes and batches alike (measured with llama.cpp and PyTorch on 2-core VMs:
1.6-1.75x one thread).  The adapters, the command line and the benchmarks take their
default from here, so that a speedup is never measured against a slower plain loop
than the one a user gets by setting the thread count.
"""

from __future__ import annotations

import numbers
import os

__all__ = ["check_threads", "usable_cores"]

#: More threads than any machine this runs on has cores: a typo, not a setting.
MAX_THREADS = 4096


def usable_cores() -> int:
    """The number of cores this process may run on.

    The CPU affinity mask (``os.sched_getaffinity``, which containers and ``taskset``
    narrow) where the platform has one, else ``os.cpu_count()``.

    Returns
    -------
    int
        At least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def check_threads(value, name: str) -> int | None:
    """``value`` as a thread count: None (the default) or an int in [1, 4096].

    Parameters
    ----------
    value : int or None
    name : str
        The argument's name, for the error.

    Returns
    -------
    int or None

    Raises
    ------
    TypeError
        If ``value`` is neither None nor an integer (bools are refused).
    ValueError
        If it is outside [1, 4096].
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int or None, got {value!r}")
    if not 1 <= value <= MAX_THREADS:
        raise ValueError(f"{name} must be in [1, {MAX_THREADS}], got {value!r}")
    return int(value)
