"""Tables of the end-to-end benchmark (``bench/bench_end_to_end.py``): medians, ratios, Markdown.

Kept apart from the runs so that ``--from-json`` and other readers of the records
need none of the models.
"""

from __future__ import annotations

import math
import statistics

import prompts as prompt_sets

from specdec.drafters.cost import DEFAULT_COST_CURVE

__all__ = ["KIND_LABELS", "cells", "fastest_plain", "identity", "label", "markdown", "summary"]

#: Plain loops (no drafting): also run at each of ``Config.plain_threads`` as ``kind@N``,
#: and the fastest of them is every ratio's baseline.
PLAIN_KINDS = ("sample", "lcpp", "hf")

KIND_LABELS = {
    "sample": "specdec.sample",
    "lookup": "specdec + PromptLookup",
    "lookup-tree": "specdec + PromptLookup, trees of candidates",
    "suffix": "specdec + SuffixDrafter",
    "ngram": "specdec + NGram",
    "chain": "specdec + Chain(PromptLookup, NGram)",
    "lookup-heuristic": "specdec + PromptLookup, HF heuristic length",
    "lookup-fixed": "specdec + PromptLookup, fixed length",
    "lookup-tie": "specdec + PromptLookup, tie_tolerance=0.06",
    "lookup-tol0": "specdec + PromptLookup, tie_tolerance=0 (sampling too)",
    "lookup-nocopy": "specdec + PromptLookup, copy_window=0",
    "lookup-kept": "specdec + PromptLookup, one decoder kept for every request",
    "sample-min2": "specdec.sample, min_eval_tokens=2",
    "lookup-min2": "specdec + PromptLookup, min_eval_tokens=2",
    "lcpp": "llama-cpp-python create_completion",
    "lcpp-lookup": "llama-cpp-python LlamaPromptLookupDecoding(10)",
    "hf": "HF generate",
    "hf-lookup": "HF generate, prompt_lookup_num_tokens=10",
}


# --- summaries --------------------------------------------------------------------------------


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _fmt(value, digits=2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def label(kind: str) -> str:
    """A run kind's name in the tables (``sample@1``: specdec.sample, 1 thread)."""
    base, _, threads = kind.partition("@")
    name = KIND_LABELS.get(base, base)
    return f"{name}, {threads} thread{'s' if threads != '1' else ''}" if threads else name


def is_plain(kind: str) -> bool:
    """Whether a kind is a plain loop (specdec's or a peer's, at any thread count)."""
    return kind.partition("@")[0] in PLAIN_KINDS


def fastest_plain(grouped: dict, backend, temperature) -> str | None:
    """The fastest plain loop at a backend and temperature: its run kind, or None.

    The plain kind (specdec's or a peer's loop, at any thread count) with the highest
    geometric mean over all prompts of its median tokens/s: the one setting a user would
    pick.  (The highest of several noisy medians on each prompt would be biased up.)
    """
    speeds: dict = {}
    for (b, t, _, kind, _), runs in grouped.items():
        if (b, t) == (backend, temperature) and is_plain(kind):
            speeds.setdefault(kind, []).append(statistics.median(r.tokens_per_second for r in runs))
    if not speeds:
        return None
    counts = max(len(v) for v in speeds.values())
    complete = {k: v for k, v in speeds.items() if len(v) == counts}  # ran on every prompt
    return max(complete, key=lambda k: _geomean(complete[k]))


def cells(records: list) -> dict:
    """Records grouped by (backend, temperature, set, kind, prompt)."""
    grouped: dict = {}
    for r in records:
        grouped.setdefault((r.backend, r.temperature, r.set, r.kind, r.prompt), []).append(r)
    return grouped


def summary(records: list) -> dict:
    """Per (backend, temperature, set, kind): speeds, ratios, passes, acceptance, identity.

    A ratio is against the fastest plain loop (:func:`fastest_plain`) on the same
    prompt, backend and temperature.
    """
    grouped = cells(records)
    out: dict = {}
    fastest_of = {(b, t): fastest_plain(grouped, b, t) for b, t in {k[:2] for k in grouped}}
    for (backend, temperature, set_name, kind, prompt), runs in grouped.items():
        key = (backend, temperature, set_name, kind)
        entry = out.setdefault(key, {"prompts": {}, "runs": []})
        speed = statistics.median(r.tokens_per_second for r in runs)
        fastest = fastest_of[backend, temperature]
        base_runs = grouped.get((backend, temperature, set_name, fastest, prompt), [])
        base = statistics.median(r.tokens_per_second for r in base_runs) if base_runs else None
        speeds = [r.tokens_per_second for r in runs]
        entry["prompts"][prompt] = {
            "tokens_per_second": speed,
            "ratio": speed / base if base else None,
            "spread": (max(speeds) / min(speeds)) if min(speeds) > 0 else None,
            "fastest_plain": fastest,
            "fastest_plain_tokens_per_second": base,
        }
        entry["runs"] += runs
    for key, entry in out.items():
        backend, temperature, set_name, kind = key
        runs = entry["runs"]
        per_prompt = entry["prompts"].values()
        entry["tokens_per_second"] = _geomean(p["tokens_per_second"] for p in per_prompt)
        ratios = [p["ratio"] for p in per_prompt if p["ratio"] is not None]
        entry["ratio"] = _geomean(ratios) if ratios else None
        entry["ratio_min"] = min(ratios) if ratios else None
        entry["ratio_max"] = max(ratios) if ratios else None
        entry["tokens_per_pass"] = (
            sum(r.tokens for r in runs) / sum(r.passes for r in runs)
            if sum(r.passes for r in runs)
            else None
        )
        drafted = sum(r.drafted for r in runs)
        entry["acceptance"] = sum(r.kept for r in runs) / drafted if drafted else None
        entry["tokens"] = sum(r.tokens for r in runs)
        hist: list = []
        for r in runs:
            for i, c in enumerate(r.draft_hist):
                if i >= len(hist):
                    hist.append(0)
                hist[i] += c
        entry["draft_hist"] = hist
        entry["identical"] = None
        if temperature == 0 and not is_plain(kind):
            # A min_eval_tokens=2 run is compared with plain decoding at the same
            # setting (never a token evaluated alone), the others with the baseline.
            baseline = (
                "sample-min2" if kind.endswith("-min2") and kind != "sample-min2" else "sample"
            )
            entry["identical"] = identity(records, backend, set_name, kind, baseline)
    return out


def identity(records, backend, set_name, kind, baseline="sample"):
    """(identical, compared) greedy outputs of ``kind`` against ``baseline``'s, per run."""
    base = {
        (r.prompt, r.repeat): r
        for r in records
        if r.backend == backend and r.temperature == 0 and r.set == set_name and r.kind == baseline
    }
    same = total = 0
    for r in records:
        if (r.backend, r.temperature, r.set, r.kind) != (backend, 0.0, set_name, kind):
            continue
        b = base.get((r.prompt, r.repeat))
        if b is None:
            continue
        total += 1
        if r.output and b.output:
            same += r.output == b.output
        else:  # llama-cpp-python: compare texts (its tokens are not returned)
            same += r.text == b.text
    return same, total


def markdown(records: list, config, meta: dict) -> str:
    """The Markdown report: one ratio table per backend and temperature, then details."""
    summ = summary(records)
    lines = []
    sets = list(prompt_sets.PROMPT_SETS)
    backends = [b for b in ("llama", "transformers") if any(k[0] == b for k in summ)]
    lines.append(
        f"Load average before / after: {meta.get('load_before')} / "
        f"{meta.get('load_after')}; {meta.get('threads_note', '')}"
    )
    lines.append("")
    lines.append(
        "Every ratio is against the **fastest plain loop**: of plain decoding's runs "
        "(specdec.sample and the peers' own loops, at every thread count run), the one "
        "with the highest geometric mean of tokens/s over the prompts."
    )
    lines.append("")
    grouped = cells(records)
    for backend in backends:
        for temperature in config.temperatures:
            fastest = fastest_plain(grouped, backend, temperature)
            if fastest is None:
                continue
            per_token = [
                1e3 / statistics.median(r.tokens_per_second for r in runs)
                for (b, t, _, kind, _), runs in grouped.items()
                if (b, t, kind) == (backend, temperature, fastest)
            ]
            lines.append(
                f"- {backend}, T={temperature}: the fastest plain loop is {label(fastest)}, "
                f"{statistics.median(per_token):.1f} ms per token (median over prompts; "
                f"{min(per_token):.1f}-{max(per_token):.1f})"
            )
    lines.append("")
    for backend in backends:
        for temperature in config.temperatures:
            kinds = [
                k
                for k in config.kinds_for(backend, temperature)
                if any(key == (backend, temperature, s, k) for key in summ for s in sets)
            ]
            if not kinds:
                continue
            title = "llama.cpp" if backend == "llama" else "transformers (PyTorch, CPU)"
            mode = "greedy" if temperature == 0 else f"temperature {temperature}"
            lines.append(f"### {title}, {mode}")
            lines.append("")
            head = "| run |"
            rule = "|---|"
            for s in sets:
                head += f" {s} tok/s | ratio (min-max) | tok/pass | accept |"
                rule += "---:|---:|---:|---:|"
            if temperature == 0:
                head += " greedy identical |"
                rule += "---:|"
            lines += [head, rule]
            for kind in kinds:
                row = f"| {label(kind)} |"
                same = total = 0
                for s in sets:
                    e = summ.get((backend, temperature, s, kind))
                    if e is None:
                        row += " — | — | — | — |"
                        continue
                    ratio = (
                        f"{_fmt(e['ratio'])} ({_fmt(e['ratio_min'])}-{_fmt(e['ratio_max'])})"
                        if e["ratio"] is not None
                        else "—"
                    )
                    row += (
                        f" {_fmt(e['tokens_per_second'], 1)} | {ratio} |"
                        f" {_fmt(e['tokens_per_pass'])} | {_fmt(e['acceptance'])} |"
                    )
                    if e["identical"]:
                        same += e["identical"][0]
                        total += e["identical"][1]
                if temperature == 0:
                    row += f" {same}/{total} |" if total else " — |"
                lines.append(row)
            lines.append("")
            if temperature == 0:
                lines.append(
                    "Greedy identical: runs whose output equals plain decoding's "
                    "token for token (by text for llama-cpp-python); a "
                    "`min_eval_tokens=2` run is compared with plain decoding at "
                    "that setting."
                )
                lines.append("")
    curves = meta.get("cost_curves") or {}
    if curves:
        sizes = list(next(iter(curves.values()))[0]["relative"])
        lines.append(
            "#### Cost of a target pass over k tokens, relative to one token "
            "(before / after the runs)"
        )
        lines.append("")
        lines.append("| backend | one token (ms) | " + " | ".join(f"k={k}" for k in sizes) + " |")
        lines.append("|---|---:|" + "---:|" * len(sizes))
        for backend, measured in curves.items():
            for when, curve in zip(("before", "after"), measured, strict=False):
                rel = curve["relative"]
                lines.append(
                    f"| {backend} ({when}) | {curve['one_token_ms']:.1f} | "
                    + " | ".join(f"{rel[k]:.2f}" for k in rel)
                    + " |"
                )
        # the policies' curve when the adapter has measured none, to compare
        lines.append(
            "| default cost curve (nothing measured) | | "
            + " | ".join(f"{DEFAULT_COST_CURVE[int(k) - 1]:.2f}" for k in sizes)
            + " |"
        )
        lines.append("")
        for name, adapter in (meta.get("adapter_curves") or {}).items():
            # what the policy was told in this process (the adapter's own calibration)
            chain, tree = adapter["chain"], adapter["tree"]
            line = f"- {name} adapter's calibration: " + ", ".join(
                f"k={k} {chain[int(k) - 1]:.2f}" for k in sizes
            )
            if tree is not None:
                line += "; a tree's premium " + ", ".join(
                    f"k={k} {tree[int(k) - 1] - chain[int(k) - 1]:+.2f}" for k in sizes
                )
            lines.append(line)
        if meta.get("adapter_curves"):
            lines.append("")
    # per-prompt ratios and draft-length histograms
    lines.append("#### Per prompt: ratio to the fastest plain loop (median tokens/s over repeats)")
    lines.append("")
    for backend in backends:
        for temperature in config.temperatures:
            kinds = [
                k
                for k in config.kinds_for(backend, temperature)
                if k != "sample"
                and any(key[0] == backend and key[1] == temperature and key[3] == k for key in summ)
            ]
            if not kinds:
                continue
            lines.append(f"{backend}, T={temperature}:")
            lines.append("")
            lines.append("| prompt | fastest plain tok/s | " + " | ".join(kinds) + " |")
            lines.append("|---|---:|" + "---:|" * len(kinds))
            for s in sets:
                base = summ.get((backend, temperature, s, "sample"))
                if base is None:
                    continue
                for prompt in base["prompts"]:
                    fastest = base["prompts"][prompt]["fastest_plain_tokens_per_second"]
                    row = f"| {prompt} | {_fmt(fastest, 1)} |"
                    for k in kinds:
                        e = summ.get((backend, temperature, s, k))
                        p = e["prompts"].get(prompt) if e else None
                        row += f" {_fmt(p['ratio']) if p else '—'} |"
                    lines.append(row)
            lines.append("")
    lines.append("#### Draft lengths chosen (histogram: entry n = steps that drafted n tokens)")
    lines.append("")
    for key, e in sorted(summ.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        if e["draft_hist"] and any(e["draft_hist"][1:]):
            backend, temperature, s, kind = key
            lines.append(f"- {backend} T={temperature} {s} {kind}: {e['draft_hist']}")
    lines.append("")
    return "\n".join(lines)
