"""Thread settings: the adapters, the command line and ``specdec batch`` decode on every
usable core by default (plain decoding's fastest setting on a quiet machine), a given
count is what the model gets, and a bad one is refused before anything loads."""

import json
import os

import pytest
from conftest import require_module, require_smollm2

from specdec import cli, models
from specdec._cores import check_threads, usable_cores
from specdec.batch.job import share_cores
from specdec.batch.models import ModelSpec
from specdec.cli import batch as batch_cli

# -- the default ------------------------------------------------------------------------------


def test_usable_cores_is_the_affinity_mask_else_the_cpu_count(monkeypatch):
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() == len(os.sched_getaffinity(0))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
        assert usable_cores() == 1
        monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert usable_cores() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: still one core
    assert usable_cores() == 1


@pytest.mark.parametrize(
    "value,error",
    [(0, ValueError), (-2, ValueError), (5000, ValueError), (1.5, TypeError), ("2", TypeError),
     (True, TypeError)],
)  # fmt: skip
def test_bad_thread_counts_are_refused_by_name(value, error):
    with pytest.raises(error, match="n_threads"):
        check_threads(value, "n_threads")


def test_good_thread_counts_pass():
    assert check_threads(None, "n_threads") is None
    assert check_threads(3, "n_threads") == 3


# -- llama.cpp --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    require_module("llama_cpp")
    return require_smollm2()


def _threads(model):
    return model.llama.n_threads, model.llama.n_threads_batch


def test_llama_defaults_to_every_usable_core_for_tokens_and_batches(smollm2):
    cores = usable_cores()
    assert _threads(models.LlamaCppModel(smollm2, n_ctx=128)) == (cores, cores)


def test_llama_batches_follow_n_threads_unless_given(smollm2):
    assert _threads(models.LlamaCppModel(smollm2, n_ctx=128, n_threads=1)) == (1, 1)
    given = models.LlamaCppModel(smollm2, n_ctx=128, n_threads=1, n_threads_batch=2)
    assert _threads(given) == (1, 2)


def test_llama_calibrations_are_kept_per_thread_setting(smollm2):
    one = models.LlamaCppModel(smollm2, n_ctx=128, n_threads=1)
    two = models.LlamaCppModel(smollm2, n_ctx=128, n_threads=2)
    assert one._calibration_key() != two._calibration_key()
    assert one._calibration_key()[-2:] == (1, 1)


@pytest.mark.parametrize("name", ["n_threads", "n_threads_batch"])
@pytest.mark.parametrize("value,error", [(0, ValueError), (2.0, TypeError)])
def test_llama_bad_threads_are_refused_before_loading(smollm2, monkeypatch, name, value, error):
    import llama_cpp

    class NotLoaded:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the model was loaded")

    monkeypatch.setattr(llama_cpp, "Llama", NotLoaded)
    with pytest.raises(error, match=name):
        models.LlamaCppModel(smollm2, n_ctx=128, **{name: value})


# -- PyTorch ----------------------------------------------------------------------------------


@pytest.fixture
def tiny_lm():
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    threads = torch.get_num_threads()
    yield transformers.GPT2LMHeadModel(config)
    torch.set_num_threads(threads)  # the setting is the process's: put it back


def test_transformers_n_threads_sets_torchs_threads(tiny_lm, monkeypatch):
    import torch

    monkeypatch.setattr(tiny_lm.config, "name_or_path", "tiny-test-model")
    before = torch.get_num_threads()
    models.TransformersModel(tiny_lm)
    assert torch.get_num_threads() == before  # unset: torch's own default stays
    model = models.TransformersModel(tiny_lm, n_threads=1)
    assert torch.get_num_threads() == 1
    assert model._calibration_key()[-1] == 1  # its calibration is kept per setting


def test_transformers_bad_n_threads_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="n_threads"):
        models.TransformersModel(tiny_lm, n_threads=0)
    with pytest.raises(TypeError, match="n_threads"):
        models.TransformersModel(tiny_lm, n_threads="all")


# -- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "demo", "batch"])
@pytest.mark.parametrize("value", ["0", "-1", "two", "5000"])
def test_cli_bad_threads_exit_2_with_one_line(capsys, tmp_path, command, value):
    argv = [command, "--threads", value]
    if command == "generate":
        argv += ["--prompt", "x"]
    if command == "batch":
        (tmp_path / "in.jsonl").write_text("")
        argv += [str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--threads" in err[-1] and "[1, 4096]" in err[-1]


def test_generate_compare_runs_plain_decoding_at_the_same_threads(capsys, smollm2, backend):
    argv = ["generate", "--prompt", "Say 1 2 3 1 2 3", "--chat", "--max-new-tokens", "8"]
    argv += ["--threads", "1", "--compare", "--json", "--backend", backend]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert (report["settings"]["n_threads"], report["settings"]["n_threads_batch"]) == (1, 1)
    assert "plain sampling (the same model, n_threads=1, n_threads_batch=1)" in err


# -- specdec batch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "threads,workers,ray,expected",
    [
        (None, 1, False, None),  # one process: the adapters' default, every usable core
        (None, 2, False, max(1, usable_cores() // 2)),  # workers share the cores
        (None, 10_000, False, 1),  # never fewer than one
        (None, 2, True, 1),  # a Ray actor reserves one CPU
        (3, 2, True, 3),  # a given count wins
        (3, 2, False, 3),
    ],
)
def test_batch_workers_share_the_cores(threads, workers, ray, expected):
    spec = ModelSpec("toy", threads=threads)
    assert share_cores(spec, workers, ray).threads == expected
    assert spec.threads == threads  # a new spec, the caller's unchanged


def test_batch_other_factories_are_left_alone():
    def factory():
        raise AssertionError("not called")

    assert share_cores(factory, 2, False) is factory


def test_batch_cli_passes_threads_to_the_spec(monkeypatch, tmp_path):
    seen = []

    def fake_run_batch(source, output, factory, options, **kwargs):
        seen.append((factory, kwargs["workers"]))
        raise OSError("stop here")

    monkeypatch.setattr(batch_cli, "run_batch", fake_run_batch)
    (tmp_path / "in.jsonl").write_text("")
    argv = ["batch", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    assert cli.main([*argv, "--model", "toy", "--workers", "2"]) == 1
    assert cli.main([*argv, "--model", "toy", "--threads", "3"]) == 1
    assert [(f.threads, w) for f, w in seen] == [(None, 2), (3, 1)]


def test_batch_model_spec_refuses_bad_threads():
    assert ModelSpec("toy", threads=2).threads == 2
    with pytest.raises(ValueError, match="threads"):
        ModelSpec("toy", threads=0)
