"""``specdec batch --ray``: a real local Ray cluster (two CPUs), never mocked.

The cluster is started once per module (per xdist worker) with ``address="local"``:
always a new cluster of its own, never one found on the machine.  Ray is the ``[ray]``
extra: without it these tests skip, and fail under ``SPECDEC_REQUIRE_MODELS=1`` (as
the model extras' tests do).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batch_files import TOY, KillingToy, by_id, check_openai_record, mixed_requests, read_records
from batch_files import write_jsonl as write_requests
from conftest import require_module

import specdec
from specdec import cli
from specdec.batch import BatchOptions, run_batch, run_requests

TESTS = Path(__file__).resolve().parent
ACTORS = 2


def _require_ray():
    require_module("ray.data")
    return require_module("ray")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local cluster of two CPUs; its workers import this directory and this specdec."""
    ray = _require_ray()
    cache = tmp_path_factory.mktemp("specdec-cache")
    path = os.pathsep.join([str(TESTS), str(Path(specdec.__file__).parents[1])])
    env = {"PYTHONPATH": path, "SPECDEC_CACHE_DIR": str(cache)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE_DIR", str(cache))
        ray.init(
            address="local",
            num_cpus=ACTORS,
            include_dashboard=False,
            logging_level="WARNING",
            runtime_env={"env_vars": env},
        )
        try:
            yield ray
        finally:
            ray.shutdown()


def test_ray_gives_the_records_of_one_and_two_local_workers(ray_cluster, tmp_path, backend):
    requests = mixed_requests()
    options = BatchOptions(backend=backend, seed=11)
    local = run_requests(requests, TOY, options)
    on_ray = run_requests(requests, TOY, options, workers=ACTORS, ray=True)
    for record in on_ray:
        check_openai_record(record)
    assert by_id(on_ray) == by_id(local)
    source = tmp_path / "in.jsonl"
    write_requests(source, requests)
    two_workers = tmp_path / "two.jsonl"
    run_batch(source, two_workers, TOY, options, workers=2)
    assert by_id(read_records(two_workers)) == by_id(local)


def test_a_killed_actor_is_restarted_and_every_request_is_written_once(ray_cluster, tmp_path):
    requests = mixed_requests(10)
    requests[6]["body"]["prompt"] = "KILL " + requests[6]["body"]["prompt"]
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(source, requests)
    marker = tmp_path / "killed"
    summary = run_batch(source, output, KillingToy(str(marker)), workers=ACTORS, ray=True)
    assert marker.exists(), "no actor was killed: the test tested nothing"
    assert int(marker.read_text()) != os.getpid()  # an actor died, not this process
    assert summary.complete and summary.written == len(requests)
    records = read_records(output)
    assert sorted(by_id(records)) == sorted(r["custom_id"] for r in requests)
    assert all(r["response"]["status_code"] == 200 for r in records)
    # the retried request's record is the one an unkilled run writes
    clean = run_requests([requests[6]], TOY)
    assert by_id(records)["req-6"] == by_id(clean)["req-6"]


def test_the_cli_runs_on_ray_and_resumes(ray_cluster, tmp_path, capsys):
    requests = mixed_requests(6)
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(source, requests[:4])
    argv = ["batch", str(source), "-o", str(output), "--model", "toy", "--max-new-tokens", "16"]
    assert cli.main([*argv, "--ray", "--workers", str(ACTORS)]) == 0
    write_requests(source, requests)
    assert cli.main([*argv, "--ray"]) == 0  # the two new requests only
    assert "6 requests: 2 served now, 4 already in" in capsys.readouterr().err
    records = read_records(output)
    assert sorted(by_id(records)) == sorted(r["custom_id"] for r in requests)
    assert cli.main(argv) == 0  # locally: nothing left, the same file
    assert len(read_records(output)) == len(requests)
