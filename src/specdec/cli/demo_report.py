"""What ``specdec demo`` prints: the texts, exactness, the counts and why it was faster."""

from __future__ import annotations

import sys

import specdec
from specdec.cli.output import bar_chart, printable, row

__all__ = ["account", "header_lines", "print_demo", "reply_separator", "write"]


def _exactness_lines(r: dict) -> list[str]:
    e, t = r["exactness"], r["settings"]["temperature"]
    if e["guarantee"] == "identical":
        if e["identical"]:
            return [
                "exactness: at temperature 0 both runs are the target's greedy continuation: "
                "the two texts are identical, as they must be."
            ]
        return [
            f"exactness: at temperature 0 the two texts should be identical, but they differ "
            f"from generated token {e['first_difference']} on.  With llama.cpp this happens "
            "where the target's two best tokens are nearly tied: it evaluates one token and a "
            "batch of tokens with different kernels, whose logits differ slightly."
        ]
    same = "happen to be identical" if e["identical"] else "differ"
    return [
        f"exactness: at temperature {t:g} both texts are draws from the same distribution, "
        "the target's own (with these top-k/top-p/min-p controls).",
        f"The same seed does not give the same text: speculative decoding uses the random "
        f"stream differently.  Here the two texts {same}.",
    ]


def reply_separator(info: dict) -> str:
    """A chat model's reply starts a new line (its template's turn header is not shown)."""
    return "\n" if info.get("chat_template") else ""


def write(piece: str) -> None:
    """Write a piece of streamed text to stdout now (escaped as :func:`printable` does)."""
    sys.stdout.write(printable(piece))
    sys.stdout.flush()


def header_lines(backend: str, description: str, prompt: str, prompt_ids) -> list[str]:
    """The demo's first lines: version and backend, the models, the prompt."""
    return [
        f"specdec {specdec.__version__} demo (backend: {backend})",
        f"models: {description}",
        f"prompt: {prompt!r} ({len(prompt_ids)} tokens)",
        "",
    ]


def account(stats: dict, plain: dict, speedup: float | None) -> str:
    """One line saying why speculative decoding was, or was not, faster here.

    Parameters
    ----------
    stats, plain : dict
        The speculative and the plain run's reports (``_stats_dict``).
    speedup : float or None
        Plain sampling's wall time over speculative decoding's.

    Returns
    -------
    str
    """
    passes = stats["num_target_forward_passes"]
    proposed, kept = stats["total_draft_tokens_proposed"], stats["total_draft_tokens_accepted"]
    plain_steps = stats["draft_length_histogram"][0] if stats["draft_length_histogram"] else 0
    per_pass = f"{stats['tokens_per_step']:.2f} tokens per target pass"
    if speedup is not None and speedup >= 1.1:
        return (
            f"why faster: {per_pass} instead of 1: {kept} of {proposed} drafted tokens were "
            "kept, and every token kept is a pass of the target saved"
        )
    if proposed == 0:
        return (
            f"why not faster: nothing was worth drafting in {plain_steps} of {passes} steps (an "
            "open prompt: the text repeats nothing the drafter has seen), so both runs did "
            "the same work and the difference is timing noise"
        )
    counts = f"{per_pass} ({kept} of {proposed} drafted tokens kept, {plain_steps} of {passes} "
    counts += "steps with nothing worth drafting)"
    if not (passes and plain["num_target_forward_passes"] and plain["target_time"] > 0):
        return f"why not (much) faster: {counts}"
    # A verifying pass that costs r one-token passes and makes t tokens saves target time
    # only if t > r: compare the two, measured, to name what ate the gain.
    ratio = (stats["target_time"] / passes) / (
        plain["target_time"] / plain["num_target_forward_passes"]
    )
    if ratio >= stats["tokens_per_step"]:
        if kept < proposed / 2:
            cause = "too few drafted tokens were kept to pay for the passes that verified them"
        else:
            cause = (
                "on this model and machine a pass over several tokens costs about what as "
                "many one-token passes do (its cost curve), so kept drafts save little"
            )
        return (
            f"why not (much) faster: {counts}, but a verifying pass cost {ratio:.1f}x a "
            f"one-token pass, at least the {stats['tokens_per_step']:.2f} tokens it made: {cause}"
        )
    return (
        f"why not (much) faster: {counts}; a verifying pass cost only {ratio:.1f}x a one-token "
        f"pass, so the target's time shrank, and the rest went to drafting "
        f"({stats.get('draft_time', 0.0):.3f} s) and the decoder "
        f"({stats.get('decoder_time', 0.0):.3f} s)"
    )


def print_demo(r: dict, streamed: bool) -> None:
    """Print the demo's report ``r`` (the speculative text too unless it was streamed)."""
    s, a, settings = r["speculative"], r["autoregressive"], r["settings"]
    out = []
    if not streamed:
        out += [
            *header_lines(r["backend"], r["model"]["description"], r["prompt"], range(0)),
            f"--- prompt + {s['total_tokens_generated']} tokens from speculative decoding ---",
            printable(r["prompt"] + reply_separator(r["model"]) + s["text"]),
        ]
        out[2] = f"prompt: {r['prompt']!r} ({r['prompt_tokens']} tokens)"
    out += [
        f"--- prompt + {a['total_tokens_generated']} tokens from plain sampling (the target "
        "alone) ---",
        printable(r["prompt"] + reply_separator(r["model"]) + a["text"]),
        "--- end ---",
        *_exactness_lines(r),
        "",
        f"speculative decoding: gamma = {settings['gamma']}, "
        f"temperature = {settings['temperature']:g}, seed = {settings['seed']}",
        row("tokens generated", str(s["total_tokens_generated"])),
        row(
            "acceptance rate",
            f"{s['acceptance_rate']:.2f}",
            f"{s['total_draft_tokens_accepted']} of {s['total_draft_tokens_proposed']} drafts kept",
        ),
        row(
            "tokens per target pass",
            f"{s['tokens_per_step']:.2f}",
            f"{s['num_target_forward_passes']} target passes, "
            f"{s['num_draft_forward_passes']} draft passes",
        ),
        "  drafts kept per step:",
        *bar_chart(s["accepted_length_histogram"]),
        "  draft tokens verified per step (0: a plain step, nothing worth drafting):",
        *bar_chart(s["draft_length_histogram"]),
        "",
    ]
    latency = settings["target_latency_ms"]
    out.append(
        f"wall time, with a simulated {latency:g} ms added to every target forward pass "
        "to stand in for a large model (--target-latency-ms):"
        if latency
        else "wall time:"
    )
    out += [
        row(
            "speculative decoding",
            f"{s['wall_time']:7.3f} s",
            f"target {s['target_time']:.3f} s, draft {s['draft_time']:.3f} s, "
            f"decoder {s['decoder_time']:.3f} s",
        ),
        row(
            "autoregressive sampling",
            f"{a['wall_time']:7.3f} s",
            f"{a['num_target_forward_passes']} target passes, same target and seed",
        ),
        row("speedup", f"{r['speedup']:7.2f}x"),
        account(s, a, r["speedup"]),
    ]
    print("\n".join(out))
