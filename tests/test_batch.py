"""``specdec batch`` and ``specdec.batch``: the format, bad lines, workers, resume, seeds.

The models are the byte-level n-grams (trained on 300 kB of the stdlib in a fraction
of a second), so nothing here needs a model extra.  Ray has its own file
(test_batch_ray.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_files import (
    TOY,
    FailingToy,
    SlowToy,
    by_id,
    check_openai_record,
    comparable,
    mixed_requests,
    read_records,
    write_jsonl,
)
from conftest import require_smollm2

import specdec
from specdec import cli
from specdec.batch import BatchOptions, ToyModels, derived_seed, run_batch, run_requests
from specdec.toymodels import byte_corpus

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def model_cache(tmp_path_factory):
    """The models' cache in a private directory (the CLI's default models train once)."""
    directory = tmp_path_factory.mktemp("specdec-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE_DIR", str(directory))
        yield directory


def _run(tmp_path, requests, name="out.jsonl", options=None, **kwargs):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, requests)
    output = tmp_path / name
    summary = run_batch(source, output, kwargs.pop("factory", TOY), options or BatchOptions(),
                        **kwargs)  # fmt: skip
    return summary, read_records(output)


# -- the format ------------------------------------------------------------------------------


def test_records_read_back_as_the_openai_batch_format(tmp_path, backend):
    requests = mixed_requests()
    summary, records = _run(tmp_path, requests, options=BatchOptions(backend=backend))
    assert summary.complete and summary.written == len(requests)
    assert [r["custom_id"] for r in records] == [r["custom_id"] for r in requests]
    for record, request in zip(records, requests, strict=True):
        check_openai_record(record)
        body = record["response"]["body"]
        chat = request["url"] == "/v1/chat/completions"
        assert body["object"] == ("chat.completion" if chat else "text_completion")
        usage, choice = body["usage"], body["choices"][0]
        assert usage["completion_tokens"] <= request["body"]["max_tokens"]
        text = choice["message"]["content"] if chat else choice["text"]
        if "stop" in request["body"] and choice["finish_reason"] == "stop":
            assert "\n" not in text
        if choice["finish_reason"] == "length":
            assert usage["completion_tokens"] == request["body"]["max_tokens"]
    # the stop string ends at least one reply early (else the check above checks nothing)
    stopped = [r for r, q in zip(records, requests, strict=True) if "stop" in q["body"]]
    assert any(r["response"]["body"]["choices"][0]["finish_reason"] == "stop" for r in stopped)


def test_a_greedy_and_a_plain_sampled_request_are_specdec_sample(backend):
    """The batch machinery adds nothing to the tokens: the same as ``specdec.sample``."""
    models = TOY()
    prompt = "def main("
    ids = byte_corpus.encode(prompt)
    requests = [
        {"custom_id": "greedy", "url": "/v1/completions", "body": {"prompt": prompt}},
        {
            "custom_id": "sampled",
            "url": "/v1/completions",
            "body": {"prompt": prompt, "temperature": 0.8, "top_k": 40},
        },  # fmt: skip
    ]
    options = BatchOptions(max_tokens=30, seed=5, backend=backend)
    greedy, sampled = run_requests(requests, TOY, options)
    expected, _ = specdec.sample(models.target, ids, 30, temperature=0.0, backend=backend)
    assert greedy["response"]["body"]["choices"][0]["text"] == byte_corpus.decode(expected[9:])
    # drafting off: the request's seed drives plain sampling, derived from --seed and its id
    plain = ToyModels(draft="none", max_bytes=300_000, context=512)
    (sampled_plain,) = run_requests([requests[1]], plain, options)
    seed = derived_seed(5, "sampled")
    assert sampled_plain["response"]["body"]["specdec"]["seed"] == seed
    expected, _ = specdec.sample(
        models.target, ids, 30, temperature=0.8, top_k=40, seed=seed, backend=backend
    )
    assert sampled_plain["response"]["body"]["choices"][0]["text"] == byte_corpus.decode(
        expected[9:]
    )
    assert sampled["response"]["status_code"] == 200


# -- reproducible: workers, order, seeds -----------------------------------------------------


def test_same_records_for_one_and_two_workers_and_any_order(tmp_path, backend):
    requests = mixed_requests()
    options = BatchOptions(backend=backend, seed=3)
    _, one = _run(tmp_path, requests, "one.jsonl", options)
    _, two = _run(tmp_path, requests, "two.jsonl", options, workers=2)
    reordered = run_requests(requests[::-1], TOY, options)
    assert by_id(one) == by_id(two) == by_id(reordered)
    # the comparison can fail: another --seed changes the sampled requests (not the greedy)
    other = by_id(run_requests(requests, TOY, BatchOptions(backend=backend, seed=4)))
    choices = lambda record: record["response"]["body"]["choices"]  # noqa: E731
    changed = {key for key in other if choices(other[key]) != choices(by_id(one)[key])}
    sampled_without_seed = {
        r["custom_id"] for r in requests
        if r["body"].get("temperature") and "seed" not in r["body"]
    }  # fmt: skip
    assert changed and changed <= sampled_without_seed


def test_derived_seeds_are_the_same_in_another_process():
    code = "from specdec.batch import derived_seed; print(derived_seed(7, 'req-1'))"
    env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=str(Path(specdec.__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert int(out.stdout) == derived_seed(7, "req-1") != derived_seed(8, "req-1")
    assert 0 <= derived_seed(7, "req-1") < 2**63


def test_stateful_drafting_runs_and_keeps_greedy_output(tmp_path, backend):
    requests = [r for r in mixed_requests() if not r["body"].get("temperature")]
    options = BatchOptions(backend=backend)
    _, fresh = _run(tmp_path, requests, "fresh.jsonl", options)
    suffix = ToyModels(draft="suffix", max_bytes=300_000, context=512)
    stateful = BatchOptions(backend=backend, stateful=True)
    _, kept = _run(tmp_path, requests, "kept.jsonl", stateful, factory=suffix)
    text = lambda r: r["response"]["body"]["choices"][0]  # noqa: E731
    assert [text(a) for a in fresh] == [text(b) for b in kept]


# -- bad lines ---------------------------------------------------------------------------------

GOOD = {"custom_id": "ok", "url": "/v1/completions", "body": {"prompt": "def f(", "max_tokens": 8}}
BAD_LINES = {
    "malformed JSON": ('{"custom_id": "x", "url": ', "not JSON"),
    "unknown url": (
        {"custom_id": "x", "url": "/v1/embeddings", "body": {"input": "a"}},
        "url must be '/v1/chat/completions' or '/v1/completions', got '/v1/embeddings'",
    ),
    "prompt longer than the context": (
        {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a" * 600}},
        "exceed the context of 512 tokens",
    ),
    "negative temperature": (
        {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a", "temperature": -1}},
        "body.temperature must be finite and >= 0",
    ),
    "temperature not a number": (
        {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a", "temperature": "hot"}},
        "body.temperature must be a finite number, got 'hot'",
    ),
    "no messages": (
        {"custom_id": "x", "url": "/v1/chat/completions", "body": {"prompt": "a"}},
        "body.messages must be a non-empty list",
    ),
    "several choices": (
        {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a", "n": 2}},
        "body.n is not supported",
    ),
    "no custom_id": ({"url": "/v1/completions", "body": {"prompt": "a"}}, "custom_id must be"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_line_is_its_own_400_record_and_the_others_go_on(tmp_path, case):
    line, message = BAD_LINES[case]
    summary, records = _run(tmp_path, [GOOD, line, {**GOOD, "custom_id": "ok2"}])
    assert summary.failed == 1 and summary.written == 3 and not summary.complete
    bad = [r for r in records if r["response"]["status_code"] != 200]
    (record,) = bad
    check_openai_record(record)
    text = record["response"]["body"]["error"]["message"]
    assert text.startswith("line 2: ") and message in text, text
    assert {r["custom_id"] for r in records if r not in bad} == {"ok", "ok2"}


@pytest.mark.parametrize(
    "line, reason",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"seed": ' + "9" * 5000 + "}", "4300"),
    ],
)
def test_a_line_past_the_json_parsers_limits_is_its_own_400_record(tmp_path, line, reason):
    # json.loads raised RecursionError / ValueError, not JSONDecodeError: the run stopped
    summary, records = _run(tmp_path, [GOOD, line])
    assert (summary.written, summary.failed) == (2, 1)
    (bad,) = [r for r in records if r["response"]["status_code"] == 400]
    text = bad["response"]["body"]["error"]["message"]
    assert text.startswith("line 2: not JSON (") and reason in text, text


def test_a_custom_id_that_reads_like_a_bad_lines_key_is_served(tmp_path):
    # a bad line 1 without an id is remembered as line-1; so was the request "line-1",
    # which was then never served (and counted as done)
    requests = ["not json", {**GOOD, "custom_id": "line-1"}]
    summary, records = _run(tmp_path, requests)
    assert (summary.written, summary.failed) == (2, 1)
    assert sorted(r["response"]["status_code"] for r in records) == [200, 400]
    summary, _ = _run(tmp_path, requests)  # resumed: both are done
    assert (summary.skipped, summary.written) == (2, 0)
    assert [r["response"]["status_code"] for r in run_requests(requests, TOY)] == [400, 200]


def test_a_byte_order_mark_before_the_first_line_is_ignored(tmp_path):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [GOOD, {**GOOD, "custom_id": "ok2"}])
    source.write_bytes(b"\xef\xbb\xbf" + source.read_bytes())  # line 1 was "not JSON"
    summary = run_batch(source, output, TOY)
    assert summary.complete and summary.failed == 0 and summary.written == 2


def test_max_completion_tokens_null_falls_back_to_max_tokens(tmp_path):
    body = {"prompt": "def f(", "max_completion_tokens": None, "max_tokens": 3}
    _, (record,) = _run(tmp_path, [{**GOOD, "body": body}], options=BatchOptions(max_tokens=8))
    assert record["response"]["body"]["usage"]["completion_tokens"] == 3


def test_the_cli_exit_status_says_some_failed(tmp_path, capsys):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [GOOD, BAD_LINES["unknown url"][0]])
    argv = ["batch", str(source), "-o", str(output), "--model", "toy", "--max-new-tokens", "8"]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err
    # stderr is not a terminal here: no progress bar, only the summary line
    assert err.splitlines() == [
        f"2 requests: 2 served now, 0 already in {output}; 1 failed (--retry-failed runs them "
        "again)"
    ]
    records = read_records(output)
    assert [r["response"]["status_code"] for r in records] == [400, 200]  # bad lines first
    assert cli.main(argv) == 3  # resumed: nothing to run, but the file still holds a failure
    assert len(read_records(output)) == 2


def test_a_duplicate_custom_id_is_refused_before_any_work(tmp_path, capsys):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [GOOD, {**GOOD, "custom_id": "other"}, "", GOOD])
    code = cli.main(["batch", str(source), "-o", str(output), "--model", "toy"])
    assert code == 2
    assert "custom_id 'ok' is on line 1 and on line 4" in capsys.readouterr().err
    assert not output.exists()
    with pytest.raises(ValueError, match="on line 1 and on line 2"):
        run_requests([GOOD, GOOD], TOY)


# -- resume -------------------------------------------------------------------------------------


def test_resume_skips_what_is_done_and_retry_failed_reruns_failures(tmp_path):
    requests = [{**GOOD, "custom_id": f"r{i}"} for i in range(4)]
    long = {"custom_id": "long", "url": "/v1/completions", "body": {"prompt": "x" * 500,
            "max_tokens": 40}}  # fmt: skip
    summary, _ = _run(tmp_path, [*requests[:2], long])
    assert (summary.written, summary.failed) == (3, 1)
    summary, records = _run(tmp_path, [*requests, long])  # two more requests in the input
    assert (summary.skipped, summary.written, summary.failed) == (3, 2, 1)
    # a larger context serves the long request; --retry-failed runs it again, once
    bigger = ToyModels(max_bytes=300_000, context=1024)
    summary, records = _run(tmp_path, [*requests, long], factory=bigger, retry_failed=True)
    assert (summary.skipped, summary.written, summary.failed) == (4, 1, 0) and summary.complete
    assert sorted(by_id(records)) == ["long", "r0", "r1", "r2", "r3"]
    assert all(r["response"]["status_code"] == 200 for r in records)


def test_an_interrupted_retry_failed_rewrite_leaves_the_file_and_no_stray(tmp_path, monkeypatch):
    from specdec.batch import output

    long = {"custom_id": "long", "url": "/v1/completions", "body": {"prompt": "x" * 500}}
    _run(tmp_path, [GOOD, long])
    path = tmp_path / "out.jsonl"
    before = path.read_bytes()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        output.ResultFile(path, retry_failed=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_a_torn_last_line_is_cut_and_its_request_runs_again(tmp_path):
    requests = mixed_requests(4)
    _, complete = _run(tmp_path, requests)
    output = tmp_path / "out.jsonl"
    lines = output.read_bytes().splitlines(keepends=True)
    output.write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    summary, records = _run(tmp_path, requests)
    assert (summary.skipped, summary.written) == (2, 2)
    assert by_id(records) == by_id(complete)


def test_an_output_that_is_not_a_batch_output_is_refused(tmp_path):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [GOOD])
    output = tmp_path / "out.jsonl"
    output.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match="line 1 is not a batch output record"):
        run_batch(source, output, TOY)
    assert output.read_text() == '{"a": 1}\n'  # left as it was
    with pytest.raises(ValueError, match="is the input"):
        run_batch(source, source, TOY)


@pytest.mark.parametrize(
    "text",
    ["important notes line 1\nimportant line 2 no newline", "a precious single line"],
)
def test_a_file_that_is_not_a_batch_output_keeps_its_last_line(tmp_path, text):
    # its last line, without a newline, was cut as a "torn record" before the check
    source, output = tmp_path / "in.jsonl", tmp_path / "notes.txt"
    write_jsonl(source, [GOOD])
    output.write_text(text)
    with pytest.raises(ValueError, match="is not a batch output record"):
        run_batch(source, output, TOY)
    assert output.read_text() == text


KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from batch_files import SlowToy
from specdec.batch import run_batch
run_batch({source!r}, {output!r}, SlowToy(0.004), workers=2)
"""


def test_resume_after_the_run_was_killed_halfway(tmp_path):
    requests = mixed_requests(24)
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, requests)
    script = KILLED_RUN.format(tests=str(TESTS), source=str(source), output=str(output))
    env = dict(os.environ, PYTHONPATH=str(Path(specdec.__file__).parents[1]))
    run = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and run.poll() is None:
            if output.exists() and output.read_bytes().count(b"\n") >= 4:
                break
            time.sleep(0.005)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the process and its workers, mid-run
        run.wait()
    assert run.returncode == -signal.SIGKILL, "the run ended before it was killed"
    written = read_records(output)
    assert 4 <= len(written) < len(requests)
    summary, records = _run(tmp_path, requests, factory=SlowToy(0.0))
    assert summary.skipped == len(written) and summary.written == len(requests) - len(written)
    assert summary.complete
    # nothing lost, nothing twice, and the same records as a run never interrupted
    _, clean = _run(tmp_path, requests, "clean.jsonl")
    assert by_id(records) == by_id(clean)
    assert [comparable(r) for r in records[: len(written)]] == [comparable(r) for r in written]


def test_a_worker_that_cannot_load_its_models_stops_the_run_with_one_line(tmp_path, capsys):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [GOOD, {**GOOD, "custom_id": "b"}])
    missing = str(tmp_path / "missing.gguf")
    code = cli.main(["batch", str(source), "-o", str(output), "--model", missing, "--workers", "2"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "could not build its models" in err and "missing.gguf" in err


def test_options_are_checked_before_any_work(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [GOOD])
    output = str(tmp_path / "out.jsonl")
    for argv, message in [
        (["--workers", "0"], "--workers: expected an integer in [1, 1024]"),
        (["--temperature", "-1"], "--temperature: expected a number >= 0"),
        (["--model", "toy", "--draft", "x.gguf"], "--draft FILE.gguf or HF-DIR needs"),
    ]:
        assert cli.main(["batch", str(source), "-o", output, *argv]) == 2
        assert message in capsys.readouterr().err
    assert cli.main(["batch", str(tmp_path / "nothing.jsonl"), "-o", output]) == 2
    assert "no such input file" in capsys.readouterr().err
    assert not Path(output).exists()
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        run_requests([GOOD], TOY, workers=0)


# -- SmolLM2 (the llama extra) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_installed():
    return require_smollm2()


@pytest.fixture(scope="module")
def smollm2(smollm2_installed):
    from specdec.batch import ModelSpec

    return ModelSpec("smollm2", "lookup", context=1024)()  # what the CLI's options build


def test_smollm2_chat_requests_are_its_greedy_replies(smollm2, backend):
    messages = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat."}]
    request = {"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": messages}}
    options = BatchOptions(max_tokens=24, backend=backend)
    (record,) = run_requests([request], lambda: smollm2, options)  # in-process: no pickling
    check_openai_record(record)
    models = smollm2
    ids = models.encode_chat(messages)
    out, _ = specdec.sample(models.target, ids, 24, models.stop_ids[0], temperature=0.0)
    reply = models.detokenize([t for t in out[len(ids) :] if t not in models.stop_ids])
    assert record["response"]["body"]["choices"][0]["message"]["content"] == reply
    assert record["response"]["body"]["model"] == "smollm2"


def test_the_progress_bar_counts_requests_tokens_and_drafts_kept(capsys):
    from specdec.batch.job import BatchSummary
    from specdec.cli.batch import _BatchProgress

    progress = _BatchProgress()
    progress.start_run(BatchSummary(requests=9, skipped=1))
    progress.bar.enabled, progress.bar.delay = True, 0.0  # as on a terminal, at once
    records = run_requests(mixed_requests(4), TOY)
    for record in records:
        progress.bar.drawn_at = None  # draw every update (the bar draws ten times a second)
        progress(record)
    line = capsys.readouterr().err.split("\r")[-1].rstrip()  # padded over a longer line
    stats = [r["response"]["body"]["specdec"] for r in records]
    drafted = sum(s["drafted"] for s in stats)
    assert drafted, "nothing drafted: the share kept is not shown"
    kept = f"{sum(s['drafts_kept'] for s in stats) / drafted:.0%} drafts kept"
    assert line.startswith("batch [") and "] 4/8 requests, " in line and "tokens/s" in line
    assert line.endswith(kept), line


def test_openai_fields_at_their_neutral_value_are_accepted():
    body = {"prompt": "a", "max_tokens": 4, "n": 1, "stream": None, "logprobs": False,
            "presence_penalty": 0, "logit_bias": {}, "model": "gpt-x", "user": "u"}  # fmt: skip
    (record,) = run_requests([{"custom_id": "a", "url": "/v1/completions", "body": body}], TOY)
    assert record["response"]["status_code"] == 200, record
    body["presence_penalty"] = 0.5
    (record,) = run_requests([{"custom_id": "a", "url": "/v1/completions", "body": body}], TOY)
    message = record["response"]["body"]["error"]["message"]
    assert "body.presence_penalty is not supported" in message


@pytest.mark.parametrize(
    "name, value", [("n", True), ("best_of", 1.0), ("echo", 0), ("presence_penalty", False)]
)
def test_a_neutral_value_of_the_wrong_kind_is_refused(name, value):
    # JSON's true equals 1 in Python: "n": true was served as n = 1.
    body = {"prompt": "a", "max_tokens": 4, name: value}
    (record,) = run_requests([{"custom_id": "a", "url": "/v1/completions", "body": body}], TOY)
    message = record["response"]["body"]["error"]["message"]
    assert f"body.{name} is not supported by specdec (got {value!r})" in message


@pytest.mark.parametrize("error_type", [ValueError, RuntimeError])
def test_a_model_failing_while_serving_is_a_500_record_and_the_batch_goes_on(error_type):
    # A ValueError from the model mid-request was a 400 "invalid_request_error", as if
    # the request were at fault.
    requests = [{**GOOD, "custom_id": "first"}, {**GOOD, "custom_id": "second"}]
    first, second = run_requests(requests, FailingToy(error_type))
    assert first["response"]["status_code"] == 500, first
    error = first["response"]["body"]["error"]
    assert error["type"] == "server_error"
    assert error["message"] == f"line 1: {error_type.__name__}: the model broke"
    assert second["response"]["status_code"] == 200, second


def test_llama_workers_exit_without_tracebacks(smollm2_installed, tmp_path):
    # Each worker kept its Llama objects until the interpreter's teardown, where
    # llama-cpp-python's Llama.__del__ no longer found its library: a traceback per worker.
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    body = {"prompt": "One, two,", "max_tokens": 4}
    write_jsonl(source, [{**GOOD, "custom_id": f"r{i}", "body": body} for i in range(2)])
    argv = ["batch", str(source), "-o", str(output), "--workers", "2", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=str(Path(specdec.__file__).parents[1]))
    run = subprocess.run(
        [sys.executable, "-m", "specdec", *argv], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [f"2 requests: 2 served now, 0 already in {output}; 0 failed"]
