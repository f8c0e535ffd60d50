r"""Turn pytest-benchmark JSON from ``bench/`` into Markdown tables of ratios.

Usage::

    PYTHONPATH=src python3 -m pytest bench/bench_decoder.py bench/bench_kernels.py \
        bench/bench_controls.py --benchmark-only --benchmark-json=/tmp/specdec-bench.json
    python3 bench/summarize.py /tmp/specdec-bench.json [more.json ...]

Several files are merged (e.g. one per suite).  Sections appear for the suites
present:

* **Decoder**: decoder microseconds per generated token (models excluded; median
  of the rounds) of the reference loop, the pure-Python and the compiled backend per
  (V, gamma, acceptance), the ratios reference/cython and python/cython, and the same
  ratios per logit (decoder time per logit of the rows whose law was computed),
  which cancels the different acceptance luck of the reference's random stream.
* **Compiled decoder per step vs np.exp**: decoder time per target step against
  ``np.exp`` over the rows the step read.
* **Kernels**: median time of one ``sample_token`` / ``verify`` call per backend, the
  ratio python/cython, and the compiled call against ``np.exp`` over the same rows.
* **Controls**: top-k, top-p and both over plain sampling, per token and per logit,
  with the tokens per step each achieved, and the compiled controls against the
  reference loop's plain sampling.

Absolute times are shown only for scale: the machines are small and shared, so
quote the ratios (measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

IMPLS = ("reference", "python", "cython")
VARIANTS = ("plain", "top_k", "top_p", "top_k+top_p")
VARIANT_LABELS = {"top_k": "top-k 50", "top_p": "top-p 0.9", "top_k+top_p": "both"}
DASH = "—"

#: "median" (default) or "min": which statistic of the rounds the tables use.
STAT = "median"


def val(extra: dict, key: str):
    """``extra[key]``, or its ``_min`` twin under ``--stat min``."""
    if STAT == "min" and f"{key}_min" in extra:
        return extra[f"{key}_min"]
    return extra[key]


# --- formatting --------------------------------------------------------------------------


def num(value, digits: int = 3) -> str:
    """A positive quantity with about ``digits`` significant figures, or a dash."""
    if value is None:
        return DASH
    if value >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = digits - 1 - (len(str(int(abs(value)))) - 1 if abs(value) >= 1 else -1)
    decimals = max(0, min(decimals, 4))
    return f"{value:.{decimals}f}"


def ratio(numerator, denominator) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return DASH
    r = numerator / denominator
    return f"{r:.1f}×" if r >= 10 else f"{r:.2f}×"


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(header)
    marks = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_v(v: int) -> str:
    return f"{v:,}"


# --- loading -----------------------------------------------------------------------------


def load(paths: list[str]) -> tuple[list[dict], dict]:
    benchmarks, meta = [], {}
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        benchmarks += data.get("benchmarks", [])
        if not meta:
            meta = {
                "machine": data.get("machine_info", {}),
                "datetime": data.get("datetime"),
                "version": data.get("version"),
            }
    return benchmarks, meta


def header_lines(meta: dict, paths: list[str]) -> str:
    machine = meta.get("machine", {})
    cpu = machine.get("cpu", {}) or {}
    brand = cpu.get("brand_raw") or machine.get("processor") or "unknown CPU"
    count = cpu.get("count")
    parts = [
        f"# specdec benchmarks ({', '.join(paths)})",
        "",
        f"- run: {meta.get('datetime') or 'unknown'}; machine: {brand}"
        + (f", {count} logical CPUs" if count else "")
        + f"; Python {machine.get('python_version', '?')}",
        "- one run on a shared machine: quote the ratios (same run), not the absolute times",
    ]
    return "\n".join(parts)


# --- sections ----------------------------------------------------------------------------


def decoder_section(benchmarks: list[dict]) -> str | None:
    cells: dict = defaultdict(dict)
    for b in benchmarks:
        e = b.get("extra_info", {})
        if e.get("kind") == "decoder":
            cells[(e["vocab_size"], e["gamma"], e["acceptance"])][e["impl"]] = e
    if not cells:
        return None
    rows, step_rows = [], []
    for v, g, a in sorted(cells):
        cell = cells[(v, g, a)]
        us = {i: val(cell[i], "decoder_us_per_token") if i in cell else None for i in IMPLS}
        ns = {i: val(cell[i], "decoder_ns_per_logit") if i in cell else None for i in IMPLS}
        any_cell = next(iter(cell.values()))
        spec = cell.get("cython") or cell.get("python")
        tps_ref = cell["reference"]["tokens_per_step"] if "reference" in cell else None
        tps_spec = spec["tokens_per_step"] if spec else None
        rows.append(
            [
                fmt_v(v),
                str(g),
                f"{a} ({any_cell['acceptance_calibrated']:.3f})",
                f"{num(tps_ref)} / {num(tps_spec)}",
                num(us["reference"]),
                num(us["python"]),
                num(us["cython"]),
                ratio(us["reference"], us["cython"]),
                ratio(us["python"], us["cython"]),
                ratio(ns["reference"], ns["cython"]),
            ]
        )
        c = cell.get("cython")
        if c and "np_exp_us_per_step" in c:
            step_rows.append(
                [
                    fmt_v(v),
                    str(g),
                    str(a),
                    num(c["rows_per_step"]),
                    num(val(c, "decoder_us_per_step")),
                    num(val(c, "np_exp_us_per_step")),
                    ratio(val(c, "decoder_us_per_step"), val(c, "np_exp_us_per_step")),
                    num(val(c, "decoder_ns_per_logit")),
                    num(val(c, "np_exp_us_per_row") * 1e3 / v),
                ]
            )
    out = [
        "## Decoder: µs per generated token (models excluded)",
        "",
        f"{STAT.capitalize()} of the rounds; temperature 1; `acceptance` is the requested "
        "per-token acceptance probability (calibrated value in parentheses); tokens/step is "
        "reference / specdec (both backends make the same decisions).  "
        "`per logit` divides by the logits rows each implementation computed a law for, "
        "which cancels the reference's different random stream.",
        "",
        table(
            [
                "V",
                "γ",
                "acceptance",
                "tokens/step ref / specdec",
                "reference µs/tok",
                "python µs/tok",
                "cython µs/tok",
                "reference / cython",
                "python / cython",
                "reference / cython per logit",
            ],
            rows,
            "rrrrrrrrrr",
        ),
    ]
    if step_rows:
        out += [
            "",
            "## Compiled decoder per target step vs one `np.exp` over the rows it read",
            "",
            "rows/step = γ draft rows + accepted + 1 target rows; `np.exp` timed between "
            "rounds over table rows at moving positions, into a preallocated buffer.",
            "",
            table(
                [
                    "V",
                    "γ",
                    "acceptance",
                    "rows/step",
                    "cython µs/step",
                    "np.exp µs/step",
                    "cython / np.exp",
                    "cython ns/logit",
                    "np.exp ns/logit",
                ],
                step_rows,
                "rrrrrrrrr",
            ),
        ]
    return "\n".join(out)


def kernel_section(benchmarks: list[dict]) -> str | None:
    times: dict = {}
    for b in benchmarks:
        e = b.get("extra_info", {})
        if e.get("kind") == "kernel":
            times[(e["op"], e["case"], e["vocab_size"], e["dtype"], e["impl"])] = (
                b["stats"][STAT] * 1e6,
                e["rows"],
            )
    if not times:
        return None
    shapes = sorted({(k[2], k[3]) for k in times})
    ops = [("sample_token", "plain"), ("verify", "all-accepted"), ("verify", "reject-first")]
    rows = []
    for op, case in ops:
        for v, dtype in shapes:
            py = times.get((op, case, v, dtype, "python"))
            cy = times.get((op, case, v, dtype, "cython"))
            exp = times.get(("np.exp", "one row", v, dtype, "numpy"))
            if py is None and cy is None:
                continue
            n_rows = (cy or py)[1]
            cy_us = cy[0] if cy else None
            exp_us = exp[0] if exp else None
            rows.append(
                [
                    f"`{op}`",
                    case,
                    fmt_v(v),
                    dtype,
                    str(n_rows),
                    num(py[0] if py else None),
                    num(cy_us),
                    ratio(py[0] if py else None, cy_us),
                    ratio(cy_us, exp_us),
                    ratio(cy_us, n_rows * exp_us if exp_us is not None else None),
                ]
            )
    exp_rows = [
        [
            fmt_v(v),
            dtype,
            num(times[("np.exp", "one row", v, dtype, "numpy")][0]),
            num(times[("np.exp", "one row", v, dtype, "numpy")][0] * 1e3 / v),
        ]
        for v, dtype in shapes
        if ("np.exp", "one row", v, dtype, "numpy") in times
    ]
    out = [
        f"## Kernels: {STAT} µs per call (γ = 4 for `verify`)",
        "",
        "rows = logits rows whose law the call computes (`reject-first` adds one "
        "residual pass); the last column compares the compiled call with `np.exp` over "
        "that many rows.",
        "",
        table(
            [
                "kernel",
                "case",
                "V",
                "dtype",
                "rows",
                "python µs",
                "cython µs",
                "python / cython",
                "cython / np.exp(1 row)",
                "cython / np.exp(rows)",
            ],
            rows,
            "llrlrrrrrr",
        ),
    ]
    if exp_rows:
        out += [
            "",
            "Yardstick, `np.exp(row, out=buffer)`:",
            "",
            table(["V", "dtype", "µs per row", "ns per logit"], exp_rows, "rlrr"),
        ]
    return "\n".join(out)


def controls_section(benchmarks: list[dict]) -> str | None:
    cells: dict = {}
    for b in benchmarks:
        e = b.get("extra_info", {})
        if e.get("kind") == "controls":
            cells[(e["vocab_size"], e["impl"], e["variant"])] = e
    if not cells:
        return None
    vocab_sizes = sorted({k[0] for k in cells})
    others = [x for x in VARIANTS if x != "plain"]

    def get(v, impl, variant, key):
        e = cells.get((v, impl, variant))
        return val(e, key) if e else None

    per_token, per_logit = [], []
    for v in vocab_sizes:
        for impl in ("python", "cython"):
            plain_us = get(v, impl, "plain", "decoder_us_per_token")
            plain_ns = get(v, impl, "plain", "decoder_ns_per_logit")
            if plain_us is None:
                continue
            per_token.append(
                [fmt_v(v), impl, num(plain_us)]
                + [ratio(get(v, impl, x, "decoder_us_per_token"), plain_us) for x in others]
            )
            per_logit.append(
                [fmt_v(v), impl, num(plain_ns)]
                + [ratio(get(v, impl, x, "decoder_ns_per_logit"), plain_ns) for x in others]
            )
    tps_rows = []
    for v in vocab_sizes:
        impl = "cython" if (v, "cython", "plain") in cells else "python"
        tps_rows.append(
            [fmt_v(v)]
            + [num(get(v, impl, x, "tokens_per_step")) for x in VARIANTS]
            + [num(get(v, "reference", "plain", "tokens_per_step"))]
        )
    ref_rows = []
    for v in vocab_sizes:
        ref_us = get(v, "reference", "plain", "decoder_us_per_token")
        ref_ns = get(v, "reference", "plain", "decoder_ns_per_logit")
        if ref_us is None:
            continue
        ref_rows.append(
            [fmt_v(v), num(ref_us)]
            + [
                f"{ratio(ref_us, get(v, 'cython', x, 'decoder_us_per_token'))} "
                f"({ratio(ref_ns, get(v, 'cython', x, 'decoder_ns_per_logit'))})"
                for x in VARIANTS
            ]
        )
    labels = [VARIANT_LABELS[x] for x in others]
    gamma = next(iter(cells.values()))["gamma"]
    acceptance = next(iter(cells.values()))["acceptance"]
    out = [
        f"## Sampling controls: cost over plain sampling (γ = {gamma}, acceptance ≈ "
        f"{acceptance} without controls, temperature 1)",
        "",
        "Per generated token (what a user sees; the controls also change the acceptance, "
        "see tokens/step below):",
        "",
        table(
            ["V", "backend", "plain µs/tok"] + [f"{x} / plain" for x in labels], per_token, "rlrrrr"
        ),
        "",
        "Per logit of the rows whose law was computed (the cost of the controls themselves):",
        "",
        table(
            ["V", "backend", "plain ns/logit"] + [f"{x} / plain" for x in labels],
            per_logit,
            "rlrrrr",
        ),
        "",
        "Tokens per target step achieved:",
        "",
        table(["V", "plain", *labels, "reference (plain)"], tps_rows, "rrrrrr"),
    ]
    if ref_rows:
        out += [
            "",
            "The reference loop (plain sampling only: it has no top-k/top-p) over the compiled "
            "backend with each control, per token (per logit in parentheses); above 1× the "
            "compiled backend is faster:",
            "",
            table(
                ["V", "reference µs/tok", "reference / cython plain"]
                + [f"reference / cython {x}" for x in labels],
                ref_rows,
                "rrrrrr",
            ),
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("json", nargs="+", help="pytest-benchmark --benchmark-json output")
    parser.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="statistic of the rounds to tabulate (default: median; min "
        "discards contention, which only ever adds time)",
    )
    args = parser.parse_args(argv)
    global STAT
    STAT = args.stat
    try:
        benchmarks, meta = load(args.json)
    except (OSError, ValueError) as error:
        print(f"summarize.py: {error}", file=sys.stderr)
        return 2
    sections = [
        s
        for s in (
            decoder_section(benchmarks),
            kernel_section(benchmarks),
            controls_section(benchmarks),
        )
        if s
    ]
    if not sections:
        print("summarize.py: no specdec bench results in the input", file=sys.stderr)
        return 1
    print("\n\n".join([header_lines(meta, args.json)] + sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
