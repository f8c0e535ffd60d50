"""Build script for the compiled core (``specdec._core``).

Environment switches:

``SPECDEC_PUREPYTHON=1``
    Build no extension: a pure-Python install (``specdec.BACKEND == "python"``).
``SPECDEC_DEBUG=1``
    Compile with Cython's bounds, wraparound and initialisation checks on, and
    without optimisation: for chasing a crash, not for speed.

A failed compile fails the build; there is no silent fallback to the slow backend.

One extension holds the kernels for every SIMD level the compiler can target (AVX-512,
AVX2 + FMA and the baseline with GCC or clang on x86; the baseline alone elsewhere): no
-march flag is needed or wanted here, the level is chosen at import (``SPECDEC_SIMD``
forces one; see src/specdec/_kernels.h).
"""

import os
import sys

from setuptools import Extension, setup


def _flag(name):
    # specdec._backend.env_flag, repeated (setup.py cannot import what it builds);
    # tests/test_backend.py checks the two agree.
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _extensions():
    if _flag("SPECDEC_PUREPYTHON"):
        return []
    import numpy
    from Cython.Build import cythonize

    debug = _flag("SPECDEC_DEBUG")
    directives = {
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": True,
    }
    if sys.platform == "win32":
        compile_args = ["/O2" if not debug else "/Od"]
    else:
        # -fopenmp-simd honours the reduction pragmas in the kernel headers without
        # linking an OpenMP runtime.  -ffp-contract=off keeps every multiply and
        # add a separate IEEE operation, as NumPy performs them in the Python twin
        # (bit-identical weights); never -ffast-math (see _kernels.h).
        # -fno-trapping-math changes no result: it only tells the compiler that no one
        # reads the floating-point exception flags, without which GCC will not turn the
        # row law's comparisons into blends below AVX-512 (the weight loop stays
        # scalar on AVX2 and SSE2).
        compile_args = [
            "-O3" if not debug else "-O0",
            "-fopenmp-simd",
            "-ffp-contract=off",
            "-fno-trapping-math",
            "-g0" if not debug else "-g",
        ]
    core = Extension(
        "specdec._core",
        sources=["src/specdec/_core.pyx"],
        include_dirs=[numpy.get_include(), "src/specdec"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=compile_args,
        depends=[
            "src/specdec/_kernels.h",
            "src/specdec/_kernels.pxd",
            "src/specdec/_row_template.h",
            "src/specdec/_residual_template.h",
        ],
    )
    return cythonize([core], compiler_directives=directives, language_level=3)


setup(ext_modules=_extensions())
