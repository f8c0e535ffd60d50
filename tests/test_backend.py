"""Backend selection: the compiled core is used unless the pure-Python mode is asked for."""

import os
import subprocess
import sys

import pytest

import specdec
from specdec._backend import available_backends, kernels_for

from conftest import PURE_PYTHON


def test_default_backend_is_compiled_unless_pure_python_is_asked_for():
    # A missing compiled core must fail the run, not quietly test the slow path.
    assert specdec.BACKEND == ("python" if PURE_PYTHON else "cython")


def test_expected_backend_of_this_installation():
    # CI states which build it installed (wheel: cython; SPECDEC_PUREPYTHON=1 install: python).
    expected = os.environ.get("SPECDEC_EXPECT_BACKEND")
    if expected is None:
        pytest.skip("SPECDEC_EXPECT_BACKEND not set (CI sets it)")
    assert specdec.BACKEND == expected
    if expected == "python":
        assert available_backends() == ("python",)


def test_kernels_for_names():
    assert kernels_for("python").__name__ == "specdec._fallback"
    if not PURE_PYTHON:
        assert kernels_for("cython").__name__ == "specdec._core"
        assert kernels_for(None) is kernels_for("cython")
    with pytest.raises(ValueError, match="backend must be"):
        kernels_for("fortran")


def test_decoder_reports_its_backend(backend):
    assert specdec.SpeculativeDecoder(backend=backend).backend == backend


def test_environment_variable_forces_python_at_import():
    code = "import specdec; print(specdec.BACKEND)"
    env = dict(os.environ, SPECDEC_PUREPYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "python"


def test_both_kernel_modules_expose_the_same_functions():
    if PURE_PYTHON:
        pytest.skip("the compiled core is not part of a pure-Python install")
    from specdec import _core, _fallback

    for name in ("Workspace", "sample_token", "row_laws", "verify"):
        assert callable(getattr(_core, name)) and callable(getattr(_fallback, name))
