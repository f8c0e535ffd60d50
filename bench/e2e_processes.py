"""The end-to-end benchmark over several processes, each with its own cost-curve calibration.

An adapter calibrates its cost curve once per process (``specdec.models``), and on a
2-core VM two calibrations a minute apart can price a 2-token pass at 1.5 and at 2.1
one-token passes: the draft lengths the policy picks, and so a prompt's speed, then
differ from one process to the next more than between the repeats of one process (the
verbatim quote: 1.78-1.99x the fastest plain loop over five processes of 2026-12-06,
each repeat within 2%). One process tells what one calibration gave; this script runs
``bench/bench_end_to_end.py`` in N fresh processes, one after the other, and reports for
every set (and, with ``--per-prompt``, every prompt) and run kind the median and the range
over the processes of the ratio to the fastest plain loop, each process's ratio taken as
``bench_end_to_end.py`` reports it (against that process's fastest plain loop).

Usage::

    # 5 processes; the arguments after -- go to bench_end_to_end.py
    PYTHONPATH=src python bench/e2e_processes.py --processes 5 --out /tmp/e2e5 \\
        --per-prompt -- --backends llama --temperatures 0 --kinds lookup,lcpp-lookup
    # the same tables from the records of earlier processes
    python bench/e2e_processes.py --per-prompt --from-json /tmp/e2e5/p*.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the benchmark's modules live beside this file
    sys.path.insert(0, str(HERE))

from bench_end_to_end import Record, _read_text  # noqa: E402
from e2e_report import is_plain, label, summary  # noqa: E402


def run_processes(n: int, out: Path, bench_args: list) -> list:
    """Run the benchmark ``n`` times, each in a new process; the paths of their records."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(1, n + 1):
        path = out / f"p{i}.json"
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"process {i}/{n}, load {load}", file=sys.stderr, flush=True)
        command = [sys.executable, str(HERE / "bench_end_to_end.py"), *bench_args]
        subprocess.run([*command, "--json", str(path)], check=True, stdout=subprocess.DEVNULL)
        paths.append(path)
    return paths


def process_ratios(paths: list) -> list:
    """Each process's ratios: ``{(backend, temperature, set, kind, prompt or None): ratio}``."""
    processes = []
    for path in paths:
        data = json.loads(_read_text(str(path)))
        entries = summary([Record(**r) for r in data["records"]])
        ratios = {}
        for (backend, temperature, set_name, kind), entry in entries.items():
            if is_plain(kind):
                continue
            ratios[backend, temperature, set_name, kind, None] = entry["ratio"]
            for prompt, cell in entry["prompts"].items():
                ratios[backend, temperature, set_name, kind, prompt] = cell["ratio"]
        processes.append(ratios)
    return processes


def table(processes: list, per_prompt: bool) -> str:
    """Markdown: the median (min-max) over the processes of every ratio."""
    keys = sorted(
        {k for ratios in processes for k in ratios if per_prompt or k[4] is None},
        key=lambda k: (k[0], k[1], k[2], k[4] or "", k[3]),
    )
    lines = [
        f"Ratio to the fastest plain loop: median (min-max) over {len(processes)} processes",
        "",
        "| backend | T | set | prompt | run | median | min-max |",
        "|---|---:|---|---|---|---:|---:|",
    ]
    for key in keys:
        values = [r[key] for r in processes if r.get(key) is not None]
        if not values:
            continue
        backend, temperature, set_name, kind, prompt = key
        lines.append(
            f"| {backend} | {temperature:g} | {set_name} | {prompt or '(geomean)'} | "
            f"{label(kind)} | {statistics.median(values):.2f} | "
            f"{min(values):.2f}-{max(values):.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=5, help="how many processes (5)")
    parser.add_argument("--out", default="e2e_processes", help="where the records go")
    parser.add_argument("--per-prompt", action="store_true", help="a row per prompt too")
    parser.add_argument("--from-json", nargs="+", help="records of earlier processes")
    args = parser.parse_args(own)
    if args.from_json:
        paths = args.from_json
    else:
        if args.processes < 1:
            parser.error("--processes must be at least 1")
        paths = run_processes(args.processes, Path(args.out), bench_args)
    print(table(process_ratios(paths), args.per_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
