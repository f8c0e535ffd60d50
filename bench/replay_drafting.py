r"""Drafting policies replayed offline on recorded outputs of a real model.

An end-to-end run of a policy on SmolLM2 takes tens of minutes and its ratios move by
5-10% from run to run on these shared machines; a change of policy worth a few percent
cannot be seen that way.  This script separates the two things a run measures:

1. **What the model writes** (``record``): the target's own output on each benchmark
   prompt (``bench/prompts.py``), greedy and sampled at a temperature with several
   seeds, through ``specdec.sample`` and :class:`specdec.models.LlamaCppModel`; and
   the adapter's cost curve (a pass over 1..16 tokens relative to one token).
2. **What a drafting policy makes of it** (``simulate``): the real decoder, drafter
   and policy run against a *replay* target that returns, at each position of the
   recorded sequence, logits whose argmax is the recorded next token, and that
   charges every call the cost curve's price of the tokens it evaluates (the
   adapters keep their cache: a call evaluates only the tokens after the common
   prefix with the previous call).

Why a replay is exact for drafters.  A drafter's tokens are one-hot drafts: token
``x`` is kept with probability ``p(x)`` and on a rejection the next token is drawn
from ``p`` without ``x``.  So the emitted token is ``x`` with probability ``p(x)``
and any other ``y`` with ``p(y)``: the same as drawing ``y ~ p`` first and keeping
the draft iff ``y == x``.  Replaying a recorded sample ``y`` of the target, greedily
(the draft kept iff it is the recorded token), therefore gives every step exactly
the kept count it has in law, for chains and for trees of one-hot candidates, at
any temperature; averaging over several recorded samples averages over the law.
A sampled trace is replayed with the draft-length policy the decoder uses while
sampling (``tie_tolerance``), a greedy one with the greedy policy.
(Draft *models* are not replayed: their drafts are random.)

The simulated speed of a run is ``tokens / (sum over passes of cost(tokens the pass
evaluates))`` in one-token passes, so plain sampling is 1.00; ``--overhead`` adds the
decoder's and drafter's own measured time per token, relative to the recorded
one-token pass time.  The ``oracle`` kinds draft exactly the tokens that will be
kept (the drafter's proposal cut where it leaves the recorded output): a bound on
what any draft-length policy can reach with that drafter and cost curve.

Run::

    PYTHONPATH=src python bench/replay_drafting.py record --samples 4 --tuning --multi \
        --out bench/results/replay_traces.json.gz
    PYTHONPATH=src python bench/replay_drafting.py simulate \
        --traces bench/results/replay_traces.json.gz --kinds lookup,suffix,oracle

``bench/results/replay_traces.json.gz`` holds the outputs recorded on 2026-12-04
(llama-cpp-python 0.3.36, built as the README advises); ``--curve`` replays them with
another cost curve (its recorded one came from the calibration before the fix of that
day: pass the curve measured now, e.g. ``--curve 1,1.84,2.19,2.56,2.93,3.3,3.67,4.05,
4.45,4.83,5.25,5.67,6.1,6.5,6.9,7.37``).  Kinds: ``lookup``, ``suffix`` (the defaults),
``lookup-tree`` and ``suffix-tree`` (trees of candidates, a tree pass charged
``TREE_OVERHEAD`` more), ``lookup-fixed`` (always 10), ``oracle`` and ``oracle-suffix``.

Nothing here asserts a speed; it prints tables (``--markdown``) to compare policies.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

import specdec
from specdec.drafters import Drafter, PromptLookup, SuffixDrafter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prompts as prompt_sets

EOS = 2  # <|im_end|> of SmolLM2's chat template


# --- the replay target ------------------------------------------------------------------


class ReplayTarget:
    """A target that writes a recorded sequence and charges the cost curve per call.

    Parameters
    ----------
    sequence : 1-D int array
        The prompt followed by the recorded output.
    vocab_size : int
        Logits per row.
    cost_curve : sequence of float
        ``cost_curve[i]``: cost of a call evaluating ``i + 1`` new tokens (1.0 for one).

    Attributes
    ----------
    cost : float
        Total cost of the calls so far, in one-token passes.
    passes : list of int
        Tokens evaluated by each call after the first (the prompt's).
    """

    def __init__(self, sequence, vocab_size: int, cost_curve) -> None:
        self.sequence = np.asarray(sequence, dtype=np.int64)
        self.vocab_size = vocab_size
        self.cost_curve = np.asarray(cost_curve, dtype=np.float64)
        self._cached = np.zeros(0, dtype=np.int64)
        self.cost = 0.0
        self.passes: list[int] = []
        self._first = True

    def _price(self, n_tokens: int) -> float:
        curve = self.cost_curve
        if n_tokens <= len(curve):
            return float(curve[n_tokens - 1])
        return float(curve[-1] + (curve[-1] - curve[-2]) * (n_tokens - len(curve)))

    def _charge(self, n_new: int) -> None:
        if self._first:  # the prompt: every system pays it alike
            self._first = False
            return
        self.passes.append(n_new)
        self.cost += self._price(n_new)

    def forward(self, ids, logits_to_keep=None):
        """Rows whose argmax is the recorded next token (token 0 off the record)."""
        ids = np.asarray(ids)[0]
        length = len(ids)
        n_rows = length if logits_to_keep is None else int(logits_to_keep)
        common = _common_prefix(ids, self._cached)
        self._charge(length - common)
        self._cached = ids.copy()
        on_record = _common_prefix(ids, self.sequence)
        rows = np.zeros((1, n_rows, self.vocab_size), dtype=np.float32)
        for r, position in enumerate(range(length - n_rows, length)):
            # row r predicts the token after `position`; it follows the record while
            # ids[: position + 1] is the record's prefix
            if position < on_record and position + 1 < len(self.sequence):
                rows[0, r, self.sequence[position + 1]] = 30.0
            else:
                rows[0, r, 0] = 30.0
        return rows

    def _next(self, position: int, on_record: bool) -> int:
        if on_record and position + 1 < len(self.sequence):
            return int(self.sequence[position + 1])
        return 0


class ReplayTreeTarget(ReplayTarget):
    """A :class:`ReplayTarget` that also scores trees of drafts in one call.

    ``tree_overhead`` multiplies the price of a tree pass (a real tree pass costs more
    than a chain of as many tokens: llama.cpp's sequence ids, the wider attention mask).
    """

    def __init__(self, sequence, vocab_size: int, cost_curve, tree_overhead: float = 1.0):
        super().__init__(sequence, vocab_size, cost_curve)
        self.tree_overhead = tree_overhead
        # what an adapter's calibration tells the policy (a tree of one node: a chain)
        tree = np.asarray(cost_curve, dtype=np.float64) * tree_overhead
        tree[:2] = self.cost_curve[:2]
        self.tree_cost_curve = tree

    def forward_tree(self, prefix, token_ids, parents):
        """Tree rows: root row after ``prefix``, then one row after each node."""
        prefix = np.asarray(prefix, dtype=np.int64)
        token_ids = np.asarray(token_ids, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        common = _common_prefix(prefix, self._cached)
        # the prefix's uncached tail plus every node, in one pass
        n_new = len(prefix) - common + len(token_ids)
        self._charge(n_new)
        if len(token_ids) > 1 and self.passes:  # a tree, not a chain of one node
            self.cost += (self.tree_overhead - 1.0) * self._price(n_new)
        self._cached = prefix.copy()
        n = len(token_ids)
        rows = np.zeros((n + 1, self.vocab_size), dtype=np.float32)
        on_record = _common_prefix(prefix, self.sequence) == len(prefix)
        depth_ok = np.zeros(n, dtype=bool)
        for i in range(n):
            parent_ok = on_record if parents[i] < 0 else depth_ok[parents[i]]
            depth = 1 if parents[i] < 0 else _depth(parents, i)
            at = len(prefix) + depth - 1
            depth_ok[i] = (
                parent_ok and at < len(self.sequence) and self.sequence[at] == token_ids[i]
            )
        rows[0, self._next(len(prefix) - 1, on_record)] = 30.0
        for i in range(n):
            at = len(prefix) + _depth(parents, i) - 1
            rows[i + 1, self._next(at, depth_ok[i])] = 30.0
        return rows


def _depth(parents, i: int) -> int:
    depth = 1
    while parents[i] >= 0:
        i = parents[i]
        depth += 1
    return depth


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class OracleDrafter(Drafter):
    """A drafter's proposal cut where it leaves the recorded output (a bound, not a drafter).

    With ``draft_length="fixed"`` every step drafts exactly the tokens it will keep.
    """

    def __init__(self, inner: Drafter, sequence) -> None:
        self.inner = inner
        self.sequence = np.asarray(sequence, dtype=np.int64)
        self.num_tokens = inner.num_tokens

    def start(self, prompt) -> None:
        self.inner.start(prompt)

    def extend(self, tokens, n_new) -> None:
        self.inner.extend(tokens, n_new)

    def propose(self, tokens, max_tokens):
        proposal = self.inner.propose(tokens, max_tokens)
        at = len(tokens)
        truth = self.sequence[at : at + len(proposal)]
        return proposal[: _common_prefix(proposal, truth)]


# --- recording ----------------------------------------------------------------------------


def record(args) -> int:
    """Record each prompt's outputs (greedy and sampled) and the adapter's cost curve."""
    from specdec import models

    target = models.LlamaCppModel(
        models.smollm2_path(),
        n_ctx=2048,
        n_threads=args.threads,
        n_threads_batch=args.batch_threads or None,
        seed=0,
    )
    llama = target.llama

    def tokenize(text):
        return list(llama.tokenize(text.encode(), add_bos=False, special=True))

    specdec.sample(target, tokenize(prompt_sets.chat("Hello")), 16, temperature=0.0)  # warm
    t0 = time.perf_counter()
    curve = [float(c) for c in target.cost_curve]
    print(f"cost curve ({time.perf_counter() - t0:.1f} s): {np.round(curve, 2).tolist()}")
    one = _one_token_seconds(target, tokenize(prompt_sets.chat("Hello there")))
    traces = []
    for set_name, prompts in _prompt_sets(args).items():
        for name, text in prompts.items():
            prompt = tokenize(text)
            runs = [(0.0, None)] + [(args.temperature, seed) for seed in range(args.samples)]
            for temperature, seed in runs:
                ids, _ = specdec.sample(
                    target, prompt, args.tokens, EOS, temperature=temperature, seed=seed
                )
                output = [int(t) for t in ids[len(prompt) :]]
                traces.append(
                    dict(
                        set=set_name,
                        prompt_name=name,
                        temperature=temperature,
                        seed=seed,
                        prompt=[int(t) for t in prompt],
                        output=output,
                    )
                )
                print(
                    f"{set_name:16s} {name:20s} T={temperature} seed={seed}: {len(output)} tokens"
                )
    meta = dict(
        model="SmolLM2-135M-Instruct Q4_1 (llama.cpp)",
        threads=args.threads,
        batch_threads=args.batch_threads or "default",
        cost_curve=curve,
        one_token_seconds=one,
        vocab_size=int(target.vocab_size),
        load=os.getloadavg(),
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    with gzip.open(args.out, "wt") as f:
        json.dump(dict(meta=meta, traces=traces), f)
    print(f"wrote {len(traces)} traces to {args.out}")
    return 0


def _prompt_sets(args) -> dict:
    sets = dict(prompt_sets.PROMPT_SETS)
    if args.tuning:
        sets.update(prompt_sets.TUNING_SETS)
    if args.multi:
        import bench_multi_request as multi

        for workload, prompts in multi.workloads().items():
            # workloads() gives chat prompts already, as bench_multi_request runs them
            sets[f"multi-{workload}"] = {f"{workload}{i:02d}": p for i, p in enumerate(prompts)}
    return sets


def _one_token_seconds(target, prompt) -> float:
    times = []
    for _ in range(20):
        target.forward(np.array([prompt]), logits_to_keep=1)
        t0 = time.perf_counter()
        target.forward(np.array([prompt + [13]]), logits_to_keep=1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- simulating ---------------------------------------------------------------------------

KINDS = {
    # name: (drafter factory, decoder keyword arguments, oracle?, trees of candidates?)
    "lookup": (PromptLookup, {}, False, False),
    "lookup-tree": (PromptLookup, {}, False, True),
    "lookup-fixed": (lambda: PromptLookup(num_tokens=10), {"draft_length": "fixed"}, False, False),
    "suffix": (SuffixDrafter, {}, False, False),
    "suffix-tree": (SuffixDrafter, {}, False, True),
    "oracle": (PromptLookup, {"draft_length": "fixed"}, True, False),
    "oracle-suffix": (SuffixDrafter, {"draft_length": "fixed"}, True, False),
}

#: A tree pass's price relative to a chain of as many tokens (llama.cpp measured 5-10%).
TREE_OVERHEAD = 1.07


@dataclass
class Result:
    """One replayed run."""

    set: str
    prompt_name: str
    temperature: float
    seed: int | None
    kind: str
    tokens: int
    cost: float
    overhead: float  # decoder and drafter seconds, relative to a one-token pass
    passes: list
    kept: int
    drafted: int

    @property
    def speed(self) -> float:
        return self.tokens / (self.cost + self.overhead)


def simulate_one(trace, kind, curve, vocab_size, one_token_seconds, overhead, state=None):
    """Replay one trace with one kind; returns a :class:`Result`."""
    make_drafter, decoder_kwargs, oracle, trees = KINDS[kind]
    prompt, output = trace["prompt"], trace["output"]
    sequence = prompt + output
    if trees:
        target = ReplayTreeTarget(sequence, vocab_size, curve, TREE_OVERHEAD)
    else:
        target = ReplayTarget(sequence, vocab_size, curve)
    drafter = state["drafter"] if state is not None else make_drafter()
    if oracle:
        drafter = OracleDrafter(drafter, sequence)
    decoder = state["decoder"] if state is not None else None
    if decoder is None:
        decoder = specdec.SpeculativeDecoder(temperature=0.0, **decoder_kwargs)
        if trace["temperature"] > 0:
            # The replay decodes greedily, but a decoder sampling at this temperature
            # sizes its drafts with its sampling policy: replay that one.
            temperature = trace["temperature"]
            sampling = specdec.SpeculativeDecoder(temperature=temperature, **decoder_kwargs)
            decoder.draft_length = sampling.draft_length_policy(drafter)
        if state is not None:
            state["decoder"] = decoder
    eos = EOS if output and output[-1] == EOS else None
    # The prompt but its last token is evaluated first, for free, as the end-to-end
    # benchmarks prefill it untimed: the first step's pass (the last prompt token and
    # the drafts) is charged like every other.
    target.forward(np.asarray([prompt[:-1]]), logits_to_keep=1)
    ids, stats = decoder.generate(drafter, target, prompt, len(output), eos)
    if list(ids[len(prompt) :]) != output:
        raise AssertionError(f"{kind} on {trace['prompt_name']}: the replay left the record")
    extra = 0.0
    if overhead:
        extra = (stats.decoder_time + stats.draft_time) / one_token_seconds
    return Result(
        trace["set"],
        trace["prompt_name"],
        trace["temperature"],
        trace["seed"],
        kind,
        len(output),
        target.cost,
        extra,
        target.passes,
        stats.total_draft_tokens_accepted,
        stats.total_draft_tokens_proposed,
    )


def simulate(args) -> int:
    """Replay every trace with every kind and print the speed tables."""
    with gzip.open(args.traces, "rt") as f:
        data = json.load(f)
    meta, traces = data["meta"], data["traces"]
    curve = meta["cost_curve"] if args.curve is None else _parse_curve(args.curve)
    kinds = args.kinds.split(",")
    results = []
    series: dict = {}  # (set, temperature, seed, kind) -> the decoder and drafter of a series
    for trace in traces:
        if args.sets and trace["set"] not in args.sets.split(","):
            continue
        for kind in kinds:
            state = None
            if trace["set"].startswith("multi-"):
                # a series of requests to one decoder and one drafter (bench_multi_request)
                key = (trace["set"], trace["temperature"], trace["seed"], kind)
                state = series.setdefault(key, {"drafter": KINDS[kind][0](), "decoder": None})
            result = simulate_one(
                trace,
                kind,
                curve,
                meta["vocab_size"],
                meta["one_token_seconds"],
                args.overhead,
                state,
            )
            if state is not None and state.setdefault("requests", 0) == 0:
                state["requests"] = 1
                continue  # request 1 warms the memories: requests 2..N are reported
            results.append(result)
    print(f"cost curve: {np.round(curve, 2).tolist()}")
    print(_table(results, kinds, args.markdown))
    return 0


def _parse_curve(text: str) -> list:
    return [float(v) for v in text.split(",")]


def _geomean(values) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _table(results, kinds, markdown: bool) -> str:
    """Geometric mean speed per (set, temperature) and kind; per prompt below."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r.set, r.temperature), {}).setdefault(r.kind, []).append(r)
    lines = []
    header = ["set", "T"] + kinds
    lines.append(_row(header, markdown))
    if markdown:
        lines.append("|" + "---|" * 2 + "---:|" * len(kinds))
    for (set_name, temperature), by_kind in groups.items():
        cells = [set_name, f"{temperature:g}"]
        for kind in kinds:
            rs = by_kind.get(kind, [])
            per_prompt = _per_prompt(rs)
            cells.append(f"{_geomean(per_prompt.values()):.3f}" if per_prompt else "-")
        lines.append(_row(cells, markdown))
    lines.append("")
    lines.append(_row(["prompt", "T"] + kinds, markdown))
    if markdown:
        lines.append("|" + "---|" * 2 + "---:|" * len(kinds))
    for (_, temperature), by_kind in groups.items():
        names = list(_per_prompt(by_kind[kinds[0]]))
        for name in names:
            cells = [name, f"{temperature:g}"]
            for kind in kinds:
                cells.append(f"{_per_prompt(by_kind[kind])[name]:.2f}")
            lines.append(_row(cells, markdown))
    return "\n".join(lines)


def _per_prompt(results) -> dict:
    """Mean speed over a prompt's samples (tokens over cost, pooled)."""
    pooled: dict = {}
    for r in results:
        tokens, cost = pooled.get(r.prompt_name, (0, 0.0))
        pooled[r.prompt_name] = (tokens + r.tokens, cost + r.cost + r.overhead)
    return {name: tokens / cost for name, (tokens, cost) in pooled.items()}


def _row(cells, markdown: bool) -> str:
    if markdown:
        return "| " + " | ".join(str(c) for c in cells) + " |"
    return "  ".join(f"{c!s:>14}" if i else f"{c!s:22}" for i, c in enumerate(cells))


def main(argv=None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record outputs and the cost curve (needs llama.cpp)")
    rec.add_argument("--out", default="bench/results/replay_traces.json.gz")
    rec.add_argument("--tokens", type=int, default=96)
    rec.add_argument("--samples", type=int, default=4, help="sampled outputs per prompt")
    rec.add_argument("--temperature", type=float, default=0.7)
    rec.add_argument("--threads", type=int, default=1)
    rec.add_argument("--batch-threads", type=int, default=0, help="0: llama-cpp-python's default")
    rec.add_argument("--multi", action="store_true", help="also bench_multi_request's workloads")
    rec.add_argument("--tuning", action="store_true", help="also prompts.TUNING_SETS")
    sim = sub.add_parser("simulate", help="replay the recorded outputs with drafting policies")
    sim.add_argument("--traces", default="bench/results/replay_traces.json.gz")
    sim.add_argument("--kinds", default="lookup,lookup-fixed,suffix,oracle")
    sim.add_argument("--sets", default="", help="comma-separated prompt sets (default: all)")
    sim.add_argument("--curve", default=None, help="a cost curve instead of the recorded one")
    sim.add_argument("--overhead", action="store_true", help="add decoder and drafter time")
    sim.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    return record(args) if args.command == "record" else simulate(args)


if __name__ == "__main__":
    raise SystemExit(main())
