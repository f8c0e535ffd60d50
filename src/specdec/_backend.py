"""Choice of the kernel backend and of its SIMD level, made once at import.

``SPECDEC_PUREPYTHON=1`` forces the pure-Python twin (as msgpack does it).  Otherwise
the compiled core is used; only its *absence* (a pure-Python install) falls back to
Python.  A core that is present but fails to load is an error that says so, never a
silent switch to the slow path.

The compiled core holds its kernels once per SIMD level (``avx512``, ``avx2``,
``baseline``; see _kernels.h) and runs the best one the CPU supports.
``SPECDEC_SIMD=<level>`` forces a level, as NumPy's ``NPY_DISABLE_CPU_FEATURES``
restricts its own: an unknown name, or a level this CPU or build lacks, is an error
at import, never a silent fallback.  ``SPECDEC_SIMD`` is ignored by the pure-Python
backend.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from specdec import _fallback
from specdec._common import SIMD_LEVELS

BACKENDS = ("cython", "python")


def env_flag(name: str) -> bool:
    """True when environment variable `name` is set to anything but "", "0", "false", "no".

    The one rule for specdec's switches (tests/conftest.py uses it; setup.py, which
    cannot import the package it builds, repeats it and a test checks they agree).
    """
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _load_core() -> ModuleType | None:
    if importlib.util.find_spec("specdec._core") is None:
        return None
    try:
        from specdec import _core
    except ImportError as exc:
        raise ImportError(
            f"specdec's compiled core is installed but failed to load ({exc}); "
            "reinstall cyspecdec, or set SPECDEC_PUREPYTHON=1 to use the pure-Python "
            "backend"
        ) from exc
    _share_docstrings(_core)
    _force_simd_level(_core, os.environ.get("SPECDEC_SIMD", "").strip().lower())
    _fallback.FUSED_F32 = _core._simd_level_fuses()
    return _core


def _force_simd_level(core: ModuleType, requested: str) -> None:
    """Apply ``SPECDEC_SIMD`` (`requested`, "" for the best level) to the core."""
    if not requested:
        return
    if requested not in SIMD_LEVELS:
        raise ValueError(
            f"SPECDEC_SIMD must be one of {', '.join(SIMD_LEVELS)} (or unset for the best "
            f"level this CPU supports), got {requested!r}"
        )
    supported = core._supported_simd_levels()
    if requested not in supported:
        raise RuntimeError(
            f"SPECDEC_SIMD={requested}: this CPU or this build of specdec lacks that level "
            f"(available here: {', '.join(supported)})"
        )
    core._use_simd_level(requested)


#: The kernel functions: the compiled core and its pure-Python twin both define them,
#: with the same signatures (tests/test_backend.py checks it).
KERNEL_FUNCTIONS = ("sample_token", "row_laws", "verify", "verify_tree")


def _share_docstrings(core: ModuleType) -> None:
    """Give the compiled kernels their twin's docstrings.

    They are written once, in _fallback.py: the twin is always installed, the core may
    not be.
    """
    for name in KERNEL_FUNCTIONS:
        getattr(core, name).__doc__ = getattr(_fallback, name).__doc__


_core = None if env_flag("SPECDEC_PUREPYTHON") else _load_core()

#: The default backend of this process: ``"cython"`` or ``"python"``.
BACKEND = "cython" if _core is not None else "python"


def simd_level() -> str | None:
    """The SIMD level the compiled kernels run at.

    Returns
    -------
    str or None
        ``"avx512"``, ``"avx2"`` or ``"baseline"``; None when this process uses the
        pure-Python backend (:data:`BACKEND` is ``"python"``).
    """
    return _core._simd_level() if BACKEND == "cython" else None


def available_simd_levels() -> tuple[str, ...]:
    """The SIMD levels this core holds and this CPU runs, best first.

    Returns
    -------
    tuple of str
        A subset of ``("avx512", "avx2", "baseline")``, always ending in
        ``"baseline"``; empty when there is no compiled core.
    """
    return _core._supported_simd_levels() if _core is not None else ()


def _use_simd_level(name: str) -> str:
    """Switch the compiled kernels to SIMD level `name`; return the previous level.

    A private hook for tests and benchmarks (one process, every level): not
    thread-safe, so never while kernels run on another thread.
    """
    if _core is None:
        raise ImportError("SIMD levels need specdec's compiled core")
    previous = _core._use_simd_level(name)
    # the twin computes the active level's float exp (see _fallback.FUSED_F32)
    _fallback.FUSED_F32 = _core._simd_level_fuses()
    return previous


def available_backends() -> tuple[str, ...]:
    """The backends this installation can run.

    Returns
    -------
    tuple of str
        ``("cython", "python")`` when the compiled core is built, else ``("python",)``.
    """
    global _core
    if _core is None:
        _core = _load_core()
    return BACKENDS if _core is not None else ("python",)


def kernels_for(backend: str | None) -> ModuleType:
    """The kernel module of a backend.

    Parameters
    ----------
    backend : {"cython", "python"} or None
        None means this process's default, :data:`BACKEND`.

    Returns
    -------
    module
        ``specdec._core`` or ``specdec._fallback``.
    """
    if backend is None:
        backend = BACKEND
    if backend == "python":
        return _fallback
    if backend == "cython":
        if "cython" not in available_backends():
            raise ImportError(
                "backend='cython' needs specdec's compiled core, which this installation "
                "does not have (it was installed with SPECDEC_PUREPYTHON=1 or not built)"
            )
        return _core
    raise ValueError(f"backend must be 'cython', 'python' or None, got {backend!r}")


def backend_name(kernels: ModuleType) -> str:
    """``"python"`` for the pure-Python twin, ``"cython"`` for the compiled core."""
    if kernels is _fallback:
        return "python"
    if _core is not None and kernels is _core:
        return "cython"
    raise ValueError(f"{kernels!r} is not one of specdec's kernel modules")
