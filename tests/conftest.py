"""Both backends for every behavioural test (as propcache and frozenlist do it).

The ``backend`` fixture runs a test once on the compiled core and once on the
pure-Python twin.  The compiled run *fails* when ``specdec._core`` is missing; only
``SPECDEC_PUREPYTHON=1`` (a pure-Python install) drops it, explicitly.
"""

import os

import pytest

import specdec
from specdec._backend import kernels_for

PURE_PYTHON = os.environ.get("SPECDEC_PUREPYTHON", "").strip().lower() not in ("", "0", "false", "no")
BACKENDS = ["python"] if PURE_PYTHON else ["cython", "python"]


@pytest.fixture(params=BACKENDS, scope="session")
def backend(request):
    """Name of the backend under test; the kernels must load (no skip)."""
    kernels_for(request.param)  # raises ImportError if the compiled core is missing
    return request.param


@pytest.fixture(scope="session")
def kernels(backend):
    """The kernel module of the backend under test."""
    return kernels_for(backend)


def pytest_report_header(config):
    return f"specdec {specdec.__version__}: default backend {specdec.BACKEND}, testing {BACKENDS}"
