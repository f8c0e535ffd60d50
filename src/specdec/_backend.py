"""Choice of the kernel backend, made once at import (as msgpack does it).

``SPECDEC_PUREPYTHON=1`` forces the pure-Python twin.  Otherwise the compiled core
is used; only its *absence* (a pure-Python install) falls back to Python.  A core
that is present but fails to load is an error that says so, never a silent switch
to the slow path.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from specdec import _fallback

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
    return _core


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
