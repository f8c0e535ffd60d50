r"""Multi-request speed: does memory across requests pay?  SuffixDrafter vs PromptLookup.

Workloads where a request's output repeats earlier requests' outputs, each a series of
requests sent one after the other to one decoder (and one drafter) through
:class:`specdec.models.LlamaCppModel` with SmolLM2-135M-Instruct:

* ``agent``: an agent loop writing a JSON tool call of one schema for ten user inputs;
* ``edits``: rounds of edits to the same function (each round's prompt holds the code);
* ``extract``: fields extracted, in one fixed format, from invoices of one layout.

Systems: plain ``specdec.sample`` (the baseline), ``SpeculativeDecoder`` with a
:class:`~specdec.drafters.SuffixDrafter` (its global tree holds the earlier requests'
outputs) and with :class:`~specdec.drafters.PromptLookup` (this request only), both
with the default draft length (``PositionalDraftLength``, kept by the decoder across
the requests) and the drafters' own ``num_tokens``.  Request 1 warms the memories;
the ratio reported is over requests 2..N: generated tokens over wall time of each
system, divided by plain's.

How it measures: greedy decoding (``--temperature`` for sampling), up to ``--tokens``
new tokens, stopping at ``<|im_end|>``.  The prompt except its last token is in the
model's cache before the clock starts (prompt processing is the same for every system);
the systems take turns request by request (rotating which goes first) so that a change
of machine load hits all alike; ``--repeats`` runs the whole series again (fresh
drafters and decoders) and each series' ratio is reported, then their median.  llama.cpp
runs with ``n_threads=1`` and its default batch threads unless ``--batch-threads``.  The
adapter measures its cost curve (passes over 1..16 tokens) before the first request, so
that the draft-length policy weighs drafts at this machine's cost and no request's time
holds the measurement.
State the load (``uptime``) with any number quoted.

Run::

    PYTHONPATH=src python bench/bench_multi_request.py --tokens 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import specdec
from specdec import models
from specdec.drafters import PromptLookup, SuffixDrafter

EOS = 2  # <|im_end|>
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user: str) -> str:
    """One user turn in SmolLM2's chat template (see bench/prompts.py)."""
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


_TOOL = (
    "You can call one tool, get_weather. Answer only with a JSON object of this form:\n"
    '{"tool": "get_weather", "arguments": {"city": "<city>", "unit": "celsius", '
    '"days": <number of days>}}\n\nUser: '
)
_ASKS = [
    "What will the weather be in Paris for the next 3 days?",
    "Tell me the forecast for Berlin over 5 days.",
    "Is it going to rain in London in the next 2 days?",
    "Weather in Madrid for the coming week (7 days), please.",
    "How warm will Rome be over the next 4 days?",
    "Give me the 3 day forecast for Vienna.",
    "Will it snow in Oslo during the next 6 days?",
    "What is the weather in Lisbon for 2 days?",
    "Forecast for Prague, next 5 days.",
    "How is the weather going to be in Dublin for 3 days?",
]

_CODE = """\
def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order["status"] == "paid":
            total += order["amount"]
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
"""
_EDITS = [
    "Rename the variable total to revenue.",
    "Add a docstring to the function.",
    "Rename the function to summarize_orders.",
    "Also skip orders whose amount is negative.",
    "Rename count to paid_orders.",
    "Round the average to two decimals.",
]

_INVOICE = """\
INVOICE {number}
Date: {date}
Bill to: {customer}, {city}
Item: {item}   Quantity: {quantity}   Unit price: {price} EUR
Total due: {total} EUR
Payment terms: 30 days
"""
_INVOICES = [
    ("2024-001", "2024-03-02", "Acme Tools", "Lyon", "hammer", 12, "9.50", "114.00"),
    ("2024-002", "2024-03-05", "Brightline Ltd", "Leeds", "ladder", 2, "79.00", "158.00"),
    ("2024-003", "2024-03-09", "Casa Verde", "Seville", "paint", 30, "4.20", "126.00"),
    ("2024-004", "2024-03-11", "Nordic Supply", "Bergen", "rope", 15, "6.00", "90.00"),
    ("2024-005", "2024-03-17", "Delta Foods", "Ghent", "crates", 40, "2.75", "110.00"),
    ("2024-006", "2024-03-21", "Elm and Oak", "York", "nails", 500, "0.05", "25.00"),
]
_EXTRACT = (
    "Extract the fields of this invoice. Answer exactly in this format:\n"
    "Invoice number: ...\nDate: ...\nCustomer: ...\nTotal: ... EUR\n\n"
)


def workloads() -> dict[str, list[str]]:
    """The request series of each workload, as chat prompts."""
    fields = ("number", "date", "customer", "city", "item", "quantity", "price", "total")
    return {
        "agent": [chat(_TOOL + ask) for ask in _ASKS],
        "edits": [
            chat(f"Here is a Python function:\n\n{_CODE}\n{edit} Reply with the whole function.")
            for edit in _EDITS
        ],
        "extract": [
            chat(_EXTRACT + _INVOICE.format(**dict(zip(fields, invoice, strict=True))))
            for invoice in _INVOICES
        ],
    }


SYSTEMS = ("plain", "suffix", "lookup")


def run_series(target, prompts, tokens, temperature, progress):
    """One pass over a workload's requests; returns {system: [(tokens, seconds, kept/pass)]}."""
    drafters = {"suffix": SuffixDrafter(), "lookup": PromptLookup()}
    decoders = {name: specdec.SpeculativeDecoder(temperature=temperature) for name in drafters}
    results = {name: [] for name in SYSTEMS}
    for i, prompt in enumerate(prompts):
        order = SYSTEMS[i % 3 :] + SYSTEMS[: i % 3]
        outputs = {}
        for name in order:
            target.forward(np.asarray([prompt[:-1]]), logits_to_keep=1)  # untimed prefill
            start = time.perf_counter()
            if name == "plain":
                ids, stats = specdec.sample(
                    target, prompt, tokens, EOS, temperature=temperature, seed=i
                )
            else:
                ids, stats = decoders[name].generate(
                    drafters[name], target, prompt, tokens, EOS, rng=i
                )
            seconds = time.perf_counter() - start
            new = len(ids) - len(prompt)
            outputs[name] = ids[len(prompt) :]
            results[name].append((new, seconds, new / max(stats.num_target_forward_passes, 1)))
        same = "" if temperature or len({tuple(v) for v in outputs.values()}) == 1 else " (differ)"
        progress(
            f"  request {i + 1}: "
            + ", ".join(
                f"{n} {results[n][-1][0] / results[n][-1][1]:.0f} tok/s "
                f"{results[n][-1][2]:.2f}/pass"
                for n in SYSTEMS
            )
            + same
        )
    return results


def speed(rows) -> float:
    """Tokens per second over requests 2..N."""
    rows = rows[1:]
    return sum(r[0] for r in rows) / sum(r[1] for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per request (96)")
    parser.add_argument("--repeats", type=int, default=1, help="series per workload (1)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--batch-threads", type=int, default=None)
    parser.add_argument("--workloads", default="agent,edits,extract")
    parser.add_argument(
        "--no-calibration",
        action="store_true",
        help="let the first request's policy start measure the cost curve (timed)",
    )
    args = parser.parse_args(argv)
    kwargs = {"n_threads_batch": args.batch_threads} if args.batch_threads else {}
    target = models.LlamaCppModel(models.smollm2_path(), n_ctx=4096, n_threads=1, seed=0, **kwargs)
    llama = target.llama
    print(
        f"specdec {specdec.__version__} ({specdec.BACKEND}) "
        f"from {os.path.dirname(specdec.__file__)}; "
        f"n_threads=1, n_threads_batch={llama.context_params.n_threads_batch}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    selected = args.workloads.split(",")
    series = {k: v for k, v in workloads().items() if k in selected}
    ids = {
        k: [list(llama.tokenize(p.encode(), add_bos=False, special=True)) for p in v]
        for k, v in series.items()
    }
    first = ids["agent" if "agent" in ids else selected[0]][0]
    specdec.sample(target, first, 8)  # warm up
    if not args.no_calibration:
        # the adapter's own calibration, now rather than inside the first timed request
        curve = " ".join(f"{c:.2f}" for c in target.cost_curve)
        print("cost curve (measured by the adapter):", curve)
    table = []
    for name, prompts in ids.items():
        ratios = {"suffix": [], "lookup": []}
        for repeat in range(args.repeats):
            print(f"{name} (series {repeat + 1}, {len(prompts)} requests):")
            results = run_series(target, prompts, args.tokens, args.temperature, print)
            base = speed(results["plain"])
            for system in ratios:
                ratios[system].append(speed(results[system]) / base)
            kept = {s: statistics.mean(r[2] for r in results[s][1:]) for s in SYSTEMS}
            print(
                f"  requests 2..N: plain {base:.1f} tok/s; suffix {ratios['suffix'][-1]:.2f}x "
                f"({kept['suffix']:.2f} tokens/pass); lookup {ratios['lookup'][-1]:.2f}x "
                f"({kept['lookup']:.2f} tokens/pass)"
            )
        table.append((name, ratios))
    print(f"\nload {os.getloadavg()[0]:.2f}\n")
    print("| workload (requests 2..N, greedy) | SuffixDrafter | PromptLookup |")
    print("|---|---:|---:|")
    for name, ratios in table:
        cells = " | ".join(
            f"{statistics.median(ratios[s]):.2f}x"
            + (f" ({', '.join(f'{r:.2f}' for r in ratios[s])})" if len(ratios[s]) > 1 else "")
            for s in ("suffix", "lookup")
        )
        print(f"| {name} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
