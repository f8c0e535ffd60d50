r"""``specdec batch`` throughput: 1 worker, 2 workers and Ray against ``specdec.sample`` in a loop.

A file of held-out requests (``bench/prompts.py``'s evaluation sets, half input-grounded,
half open-ended, cycled to ``--requests`` chat requests) served greedily by SmolLM2-135M
(llama.cpp; one process decodes on every usable core, each of two workers or Ray actors
on its share, as ``specdec batch`` gives them) through:

* ``loop-plain``: ``specdec.sample`` in a Python loop (the baseline);
* ``loop-lookup``: ``SpeculativeDecoder`` with ``PromptLookup`` in a loop, with what
  ``specdec batch`` gives each request (a fresh ``PositionalDraftLength`` over the fixed
  cost curve, the target's cache reset);
* ``batch1-plain``, ``batch1``: ``specdec.batch`` in this process (records written to a
  file), without and with drafting;
* ``batch2``: two worker processes;
* ``ray1``, ``ray2``: a local Ray cluster, one and two actors.

One interleaved run: the requests are cut into ``--rounds`` chunks and every system
serves each chunk in turn, in an order rotated per chunk, so a change of load hits all
alike.  Models are loaded before the clock: the worker pool is started once; Ray's actors
start with each chunk, so a Ray chunk is timed from its first record to its last, over
the chunk less one request per actor (a pool's startup is not a per-request cost).

Reported: requests and tokens per second per system (over all chunks), the ratios to
``loop-plain``; the batch machinery's overhead per request (``batch1`` against
``loop-lookup``, ``batch1-plain`` against ``loop-plain``) and Ray's (``ray1`` against
``batch1``), in milliseconds and as a share of a 96-token request's time; drafting's
speedup (``batch1`` over ``batch1-plain``) on each half.  The greedy outputs of every
system are checked to be identical (else the comparison would be of different work).
State the load (``uptime``) with any number quoted; the script prints it before and after.

Run::

    PYTHONPATH=src python bench/bench_batch.py --requests 200 --tokens 96
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prompts

import specdec
from specdec.batch import BatchOptions, ModelSpec, parse_lines
from specdec.batch.job import share_cores
from specdec.batch.output import ResultFile
from specdec.batch.runner import RequestRunner
from specdec.batch.workers import serve_in_processes, start_workers
from specdec.drafters import PromptLookup
from specdec.drafters.cost import DEFAULT_COST_CURVE, CostCurve
from specdec.drafters.positional import PositionalDraftLength

SYSTEMS = ("loop-plain", "loop-lookup", "batch1-plain", "batch1", "batch2", "ray1", "ray2")
REFERENCE_TOKENS = 96


def _user_text(templated: str) -> str:
    return templated.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def build_requests(n: int, max_tokens: int) -> list[dict]:
    """*n* chat requests, grounded and open alternately, cycling the held-out prompts."""
    grounded = list(prompts.INPUT_GROUNDED.values())
    open_ended = list(prompts.OPEN_ENDED.values())
    requests = []
    for i in range(n):
        kind, texts = ("grounded", grounded) if i % 2 == 0 else ("open", open_ended)
        text = _user_text(texts[(i // 2) % len(texts)])
        requests.append({
            "custom_id": f"{kind}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                     "temperature": 0},
        })  # fmt: skip
    return requests


class Loop:
    """``specdec.sample`` or a fresh ``SpeculativeDecoder`` per request, in a loop."""

    def __init__(self, models, draft: bool):
        self.models, self.draft = models, draft

    def serve(self, requests) -> list:
        models, texts = self.models, []
        eos = models.stop_ids[0]
        for request in requests:
            ids = models.encode_chat(request.messages)
            models.target.reset()
            if self.draft:
                policy = PositionalDraftLength(target_cost=CostCurve(DEFAULT_COST_CURVE))
                decoder = specdec.SpeculativeDecoder(temperature=0.0, draft_length=policy)
                out, _ = decoder.generate(PromptLookup(), models.target, ids,
                                          request.max_tokens, eos)  # fmt: skip
            else:
                out, _ = specdec.sample(models.target, ids, request.max_tokens, eos,
                                        temperature=0.0)  # fmt: skip
            new = out[len(ids) :]
            texts.append((request.custom_id, len(new)))
        return texts


def _write_all(records, directory, name) -> list:
    out = []
    with ResultFile(Path(directory) / name) as file:
        for record in records:
            file.write(record)
            body = record["response"]["body"]
            out.append(
                (record["custom_id"], body["usage"]["completion_tokens"], time.perf_counter())
            )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=REFERENCE_TOKENS)
    parser.add_argument("--rounds", type=int, default=10, help="chunks the requests are cut into")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", help="write the raw timings here")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    print(f"load before: {os.getloadavg()}; {os.cpu_count()} CPUs", flush=True)
    lines = [json.dumps(r) for r in build_requests(args.requests, args.tokens)]
    requests, bad = parse_lines(lines)
    assert not bad, bad
    options = BatchOptions(max_tokens=args.tokens)
    spec = ModelSpec("smollm2", "lookup", context=2048)
    plain_spec = ModelSpec("smollm2", "none", context=2048)
    models, plain_models = spec(), plain_spec()
    runners = {"batch1": RequestRunner(models, options),
               "batch1-plain": RequestRunner(plain_models, options)}  # fmt: skip
    loops = {"loop-plain": Loop(plain_models, False), "loop-lookup": Loop(models, True)}
    pool = None
    worker_spec = share_cores(spec, 2, False)  # as `specdec batch --workers 2` gives them
    ray_spec = share_cores(spec, 1, True)
    if "batch2" in systems:
        pool = start_workers(worker_spec, options, 2)
        list(serve_in_processes(requests[:2], worker_spec, options, 2, pool=pool))  # warm both
    ray = None
    if any(s.startswith("ray") for s in systems):
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
        from specdec.batch.ray_stage import serve_on_ray
    for runner in runners.values():  # page the weights in, outside the clock
        runner.run(requests[0])
    loops["loop-plain"].serve(requests[:1])

    # chunks of one kind each (grounded, open alternately): drafting's speedup per kind
    halves = {k: [r for r in requests if r.custom_id.startswith(k)] for k in ("grounded", "open")}
    per_kind = max(1, args.rounds // 2)
    chunks = [(kind, halves[kind][i::per_kind]) for i in range(per_kind) for kind in halves]
    kinds = [kind for kind, _ in chunks]
    timings = {s: [] for s in systems}  # (requests timed, tokens, seconds) per chunk
    outputs = {s: {} for s in systems}
    directory = tempfile.mkdtemp(prefix="bench-batch-")
    for round_, (_, chunk) in enumerate(chunks):
        order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
        for system in order:
            start = time.perf_counter()
            name = f"{system}-{round_}.jsonl"
            if system in loops:
                done = [(c, n, None) for c, n in loops[system].serve(chunk)]
            elif system in runners:
                done = _write_all((runners[system].run(r) for r in chunk), directory, name)
            elif system == "batch2":
                served = serve_in_processes(chunk, worker_spec, options, 2, pool=pool)
                done = _write_all(served, directory, name)
            else:
                actors = int(system[-1])
                served = serve_on_ray(chunk, ray_spec, options, actors)
                done = _write_all(served, directory, name)
            end = time.perf_counter()
            tokens = sum(n for _, n, _ in done)
            if system.startswith("ray"):  # from the first record: actors' startup excluded
                first = min(t for _, _, t in done)
                first_n = [n for _, n, t in done if t == first][0]
                timed = (len(done) - 1, tokens - first_n, end - first)
            else:
                timed = (len(done), tokens, end - start)
            timings[system].append(timed)
            outputs[system].update({c: n for c, n, _ in done})
            print(f"round {round_} {system}: {timed[0]} requests, {timed[1]} tokens, "
                  f"{timed[2]:.2f} s", flush=True)  # fmt: skip
    del models, plain_models, runners, loops  # llama.cpp frees them before the interpreter goes
    if pool is not None:
        pool.shutdown()
    if ray is not None:
        ray.shutdown()
    print(f"load after: {os.getloadavg()}", flush=True)
    report(systems, timings, outputs, kinds)
    if args.json:
        raw = {"timings": timings, "kinds": kinds, "args": vars(args)}
        Path(args.json).write_text(json.dumps(raw))
    return 0


def _rates(rows):
    n, tokens, seconds = (sum(column) for column in zip(*rows, strict=True))
    return n / seconds, tokens / seconds, seconds / max(n, 1)


def report(systems, timings, outputs, kinds) -> None:
    reference = outputs[systems[0]]
    for system in systems[1:]:
        if outputs[system] != reference:
            print(f"WARNING: {system} generated other token counts than {systems[0]}")
    rates = {s: _rates(timings[s]) for s in systems}
    base = rates.get("loop-plain")
    print("\n| system | requests/s | tokens/s | vs loop-plain (tokens/s) |")
    print("| --- | --- | --- | --- |")
    for s in systems:
        ratio = f"{rates[s][1] / base[1]:.2f}x" if base else "-"
        print(f"| {s} | {rates[s][0]:.3f} | {rates[s][1]:.1f} | {ratio} |")

    def per_request(system):  # seconds per request, median over chunks
        return statistics.median(sec / n for n, _, sec in timings[system] if n)

    def tokens_per_request(system):
        return sum(t for _, t, _ in timings[system]) / sum(n for n, _, _ in timings[system])

    if "loop-plain" in systems:
        scale = REFERENCE_TOKENS / tokens_per_request("loop-plain")
        reference_time = per_request("loop-plain") * scale
        print(f"\nplain request of {REFERENCE_TOKENS} tokens: {reference_time * 1000:.0f} ms")
        for a, b in (("batch1-plain", "loop-plain"), ("batch1", "loop-lookup"),
                     ("ray1", "batch1")):  # fmt: skip
            if a in systems and b in systems:
                extra = per_request(a) - per_request(b)
                print(
                    f"overhead {a} vs {b}: {extra * 1000:+.1f} ms per request "
                    f"({extra / reference_time:+.1%} of a {REFERENCE_TOKENS}-token request)"
                )
    if "batch1" in systems and "batch1-plain" in systems:
        for kind in ("grounded", "open"):
            chunks = [i for i, k in enumerate(kinds) if k == kind]
            drafted = sum(timings["batch1"][i][2] for i in chunks)
            plain = sum(timings["batch1-plain"][i][2] for i in chunks)
            print(
                f"drafting's speedup on the {kind} half (batch1-plain time / batch1 time, "
                f"same tokens): {plain / drafted:.2f}x"
            )


if __name__ == "__main__":
    sys.exit(main())
