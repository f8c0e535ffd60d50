"""Backend selection: the compiled core is used unless the pure-Python mode is asked for."""

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import PURE_PYTHON

import specdec
from specdec import _backend
from specdec._backend import (
    KERNEL_FUNCTIONS,
    available_backends,
    available_simd_levels,
    env_flag,
    kernels_for,
)
from specdec._common import LAW_DTYPE, SIMD_LEVELS
from specdec._validation import SamplingControls

# What an installation can break: .ci/run's wheel and pure-Python stages run these (-m install).
pytestmark = pytest.mark.install


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


@pytest.mark.parametrize("value", ["fortran", ["python"], {}, b"cython"])
@pytest.mark.parametrize(
    "call",
    [
        lambda value: specdec.SpeculativeDecoder(backend=value),
        lambda value: specdec.sample(lambda ids: np.zeros((1, 1, 3)), [1], 2, backend=value),
        lambda value: specdec.verify([], None, np.zeros((1, 3)), backend=value),
    ],
)
def test_a_bad_backend_is_named_whatever_its_type(call, value):
    with pytest.raises(ValueError, match="backend must be 'cython', 'python' or None, got"):
        call(value)


def test_decoder_reports_its_backend(backend):
    assert specdec.SpeculativeDecoder(backend=backend).backend == backend


def test_environment_variable_forces_python_at_import():
    code = "import specdec; print(specdec.BACKEND)"
    env = dict(os.environ, SPECDEC_PUREPYTHON="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "python"


# --- the twin contract: same functions, same signatures, same docs, same errors ------------

needs_core = pytest.mark.skipif(PURE_PYTHON, reason="no compiled core in a pure-Python install")


def _public(module):
    """The callables a kernel module defines itself (not what it imports)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    }


@pytest.mark.skipif(
    not (Path(__file__).parents[1] / "setup.py").is_file(),
    reason="tests run outside the source tree (no setup.py beside them)",
)
@pytest.mark.parametrize("value", ["", "0", "false", "No", " no ", "1", "yes", "TRUE", "x"])
def test_setup_py_reads_environment_flags_by_the_same_rule(value, monkeypatch):
    """setup.py cannot import specdec, so it repeats env_flag: the two must agree."""
    tree = ast.parse((Path(__file__).parents[1] / "setup.py").read_text())
    (flag,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_flag"]
    namespace = {"os": os}
    exec(compile(ast.Module(body=[flag], type_ignores=[]), "setup.py", "exec"), namespace)
    monkeypatch.setenv("SPECDEC_TEST_FLAG", value)
    assert namespace["_flag"]("SPECDEC_TEST_FLAG") == env_flag("SPECDEC_TEST_FLAG")


@needs_core
def test_both_kernel_modules_define_the_same_functions():
    from specdec import _core, _fallback

    assert _public(_core) == _public(_fallback) == {"Workspace", *KERNEL_FUNCTIONS}


@needs_core
@pytest.mark.parametrize("name", KERNEL_FUNCTIONS)
def test_same_signatures(name):
    from specdec import _core, _fallback

    assert inspect.signature(getattr(_core, name)) == inspect.signature(getattr(_fallback, name))


def _stub_signatures():
    """Parameter names and defaults of the functions in _core.pyi."""
    stub = Path(specdec.__file__).with_name("_core.pyi").read_text()
    out = {}
    for node in ast.parse(stub).body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            defaults = [None] * (len(args.args) - len(args.defaults)) + [
                ast.literal_eval(d) for d in args.defaults
            ]
            out[node.name] = [(a.arg, d) for a, d in zip(args.args, defaults, strict=True)]
        elif isinstance(node, ast.ClassDef):
            out[node.name] = None
    return out


@pytest.mark.parametrize("name", KERNEL_FUNCTIONS)
def test_typing_stub_matches_the_twin(name):
    from specdec import _fallback

    stub = _stub_signatures()
    # the twins, and the compiled core's private extras (the engine's _BatchStep)
    assert {n for n in stub if not n.startswith("_")} == {"Workspace", *KERNEL_FUNCTIONS}
    parameters = inspect.signature(getattr(_fallback, name)).parameters.values()
    expected = [(p.name, None if p.default is p.empty else p.default) for p in parameters]
    assert stub[name] == expected


@pytest.mark.parametrize("name", KERNEL_FUNCTIONS)
def test_the_twin_carries_numpydoc_docstrings_and_the_core_shares_them(name):
    from specdec import _fallback

    doc = getattr(_fallback, name).__doc__
    for section in ("Parameters\n    ----------", "Raises\n    ------"):
        assert section in doc, (name, section)
    assert "Returns\n    -------" in doc or name == "row_laws"
    for parameter in inspect.signature(getattr(_fallback, name)).parameters:
        assert parameter in doc, (name, parameter)
    if not PURE_PYTHON:
        from specdec import _core

        assert getattr(_core, name).__doc__ == doc


def _bad_calls(kernels):
    """Calls of each kernel with one bad argument each."""
    V = 6
    controls = SamplingControls.from_user(1.0)
    rows = np.zeros((3, V), dtype=np.float32)
    tokens = np.array([1, 2], dtype=np.int64)
    weights, laws = np.ones((2, V), dtype=np.float32), np.ones(2, LAW_DTYPE)
    work, rng = kernels.Workspace(V), np.random.default_rng(0)
    law1, w1 = np.zeros(1, LAW_DTYPE), np.empty(V, np.float32)
    nan_row = np.full(V, np.nan, dtype=np.float32)
    parents, path = np.array([-1, 0]), np.zeros(2, np.int64)
    return {
        "sample_token: NaN row": lambda: kernels.sample_token(
            nan_row, controls, rng, law1, w1, work
        ),
        "sample_token: wrong size": lambda: kernels.sample_token(
            np.zeros(V + 1, np.float32), controls, rng, law1, w1, work
        ),
        "sample_token: float16": lambda: kernels.sample_token(
            np.zeros(V, np.float16), controls, rng, law1, w1, work
        ),
        "row_laws: laws of floats": lambda: kernels.row_laws(
            rows, controls, np.zeros(3), rows.copy(), work
        ),
        "row_laws: weights of another dtype": lambda: kernels.row_laws(
            rows, controls, np.zeros(3, LAW_DTYPE), rows.astype(np.float64), work
        ),
        "verify: rows for another count": lambda: kernels.verify(
            rows[:2], tokens, weights, laws, True, controls, rng, work, False
        ),
        "verify: token outside V": lambda: kernels.verify(
            rows, np.array([1, V]), weights, laws, True, controls, rng, work, False
        ),
        "verify: weights without laws": lambda: kernels.verify(
            rows, tokens, weights, None, True, controls, rng, work, False
        ),
        "verify: block not a bool": lambda: kernels.verify(
            rows, tokens, None, None, True, controls, rng, work, "yes"
        ),
        "verify: float tokens": lambda: kernels.verify(
            rows, tokens.astype(float), None, None, True, controls, rng, work, True
        ),
        "verify: NaN target row": lambda: kernels.verify(
            np.vstack([nan_row] * 3), tokens, None, None, True, controls, rng, work, True
        ),
        "verify_tree: parent after its node": lambda: kernels.verify_tree(
            rows, tokens, np.array([-1, 1]), weights, laws, controls, rng, work, path
        ),
        "verify_tree: parent below -1": lambda: kernels.verify_tree(
            rows, tokens, np.array([-2, 0]), None, None, controls, rng, work, path
        ),
        "verify_tree: float parents": lambda: kernels.verify_tree(
            rows, tokens, np.array([-1.0, 0.0]), None, None, controls, rng, work, path
        ),
        "verify_tree: rows for another count": lambda: kernels.verify_tree(
            rows[:2], tokens, parents, None, None, controls, rng, work, path
        ),
        "verify_tree: token outside V": lambda: kernels.verify_tree(
            rows, np.array([1, V]), parents, None, None, controls, rng, work, path
        ),
        "verify_tree: short path_out": lambda: kernels.verify_tree(
            rows, tokens, parents, None, None, controls, rng, work, path[:1]
        ),
        "verify_tree: float path_out": lambda: kernels.verify_tree(
            rows, tokens, parents, None, None, controls, rng, work, path.astype(float)
        ),
        "verify_tree: NaN target row": lambda: kernels.verify_tree(
            np.vstack([nan_row] * 3), tokens, parents, None, None, controls, rng, work, path
        ),
    }


@needs_core
def test_both_backends_raise_the_same_exception_types():
    from specdec import _core, _fallback

    raised = {}
    for kernels in (_core, _fallback):
        for case, call in _bad_calls(kernels).items():
            with pytest.raises((TypeError, ValueError)) as info:
                call()
            raised.setdefault(case, []).append(type(info.value))
    assert all(a is b for a, b in raised.values()), raised


# --- SIMD levels: chosen once at import, forced with SPECDEC_SIMD ---------------------------


def _import_with(env_value, code="import specdec.kernels as k; print(k.SIMD_LEVEL)"):
    env = dict(os.environ, SPECDEC_SIMD=env_value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@needs_core
def test_the_best_supported_level_is_the_default():
    levels = available_simd_levels()
    assert levels[-1] == "baseline" and set(levels) <= set(SIMD_LEVELS)
    assert list(levels) == [name for name in SIMD_LEVELS if name in levels]  # best first
    assert _import_with("").stdout.strip() == levels[0]


@needs_core
@pytest.mark.parametrize("level", SIMD_LEVELS)
def test_environment_variable_forces_each_available_level(level):
    if level not in available_simd_levels():
        pytest.skip(f"{level} is not available on this CPU or build")
    result = _import_with(f" {level.upper()} ")  # the name is trimmed and case-blind
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == level


@needs_core
def test_an_unknown_level_is_an_error_at_import():
    result = _import_with("avx1024", code="import specdec")
    assert result.returncode != 0
    assert "ValueError: SPECDEC_SIMD must be one of avx512, avx2, baseline" in result.stderr
    assert "'avx1024'" in result.stderr


@needs_core
def test_an_unavailable_level_is_an_error_naming_the_available_ones(monkeypatch):
    from specdec import _core

    monkeypatch.setattr(_core, "_supported_simd_levels", lambda: ("baseline",))
    with pytest.raises(RuntimeError, match=r"SPECDEC_SIMD=avx2: .* \(available here: baseline\)"):
        _backend._force_simd_level(_core, "avx2")


@needs_core
def test_the_private_hook_switches_levels_and_rejects_unknown_ones():
    import specdec.kernels

    first = specdec.kernels.SIMD_LEVEL
    for level in available_simd_levels():
        previous = _backend._use_simd_level(level)
        try:
            assert specdec.kernels.SIMD_LEVEL == level
        finally:
            _backend._use_simd_level(previous)
    assert specdec.kernels.SIMD_LEVEL == first
    with pytest.raises(ValueError, match="SIMD level must be one of"):
        _backend._use_simd_level("avx1024")
    assert specdec.kernels.SIMD_LEVEL == first


@pytest.mark.skipif(not PURE_PYTHON, reason="the pure-Python backend has no SIMD level")
def test_pure_python_has_no_simd_level():
    import specdec.kernels

    assert specdec.kernels.SIMD_LEVEL is None
