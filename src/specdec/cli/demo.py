"""``specdec demo``: speculative decoding end to end, beside plain sampling.

Both runs use the same target, controls and seed.  The demo prints both texts
and says what exactness means for them: at temperature 0 they must be
identical; above it they are draws from the same law, which the same seed does
not make the same text (speculative decoding uses the random stream
differently).
"""

from __future__ import annotations

import argparse
import time

import specdec
from specdec.cli import demo_models, demo_report, runs
from specdec.cli.options import (
    MAX_DEFAULT_DRAFT,
    MAX_LATENCY_MS,
    MAX_SEED,
    NGRAM_MODEL,
    TOY,
    CLIError,
    UsageError,
    add_gamma,
    add_max_new_tokens,
    add_threads_option,
    number,
    renamed_choice,
)
from specdec.cli.output import Progress, print_json, printable
from specdec.drafters import Drafter

__all__ = [
    "configure",
    "run_demo",
    "DEFAULT_PROMPT",
    "DEFAULT_TASK",
    "STATS_FIELDS",
    "MAX_GGUF_CONTEXT",
]

#: What the n-gram models continue (they know code, not chat).
DEFAULT_PROMPT = 'def read_config(path):\n    """'
#: What a GGUF chat model gets by default: a task whose answer quotes its input, the
#: kind of work (edits, quotes, reformatting) where drafts copied from the prompt pay.
#: SmolLM2-135M quotes the whole text when asked for one paragraph: all the better.
DEFAULT_TASK = (
    "Here is a text:\n\n"
    "The lighthouse at Carrow Point was built in 1852 from granite quarried on the island "
    "itself. Its lamp was first lit with whale oil, then with paraffin, and finally, in 1931, "
    "with electricity.\n\n"
    "For ninety years the keepers lived in the small cottage at the foot of the tower. They "
    "wound the clockwork that turned the lens every four hours, cleaned the glass each "
    "morning, and wrote the weather in a logbook that is now kept in the town museum.\n\n"
    "Quote the second paragraph of the text exactly, word for word."
)
#: llama.cpp keeps a row of logits per context position (``n_ctx * V`` floats,
#: some 6 GB at 32,768 positions and V = 49,152), for the target and the draft.
MAX_GGUF_CONTEXT = 32_768
STATS_FIELDS = (
    "total_tokens_generated",
    "total_draft_tokens_proposed",
    "total_draft_tokens_accepted",
    "num_target_forward_passes",
    "num_draft_forward_passes",
    "draft_time",
    "target_time",
    "decoder_time",
)

_latency = number(
    float, lo=0.0, hi=MAX_LATENCY_MS, what=f"a number of milliseconds in [0, {MAX_LATENCY_MS:g}]"
)


def _prompt(text: str) -> str:
    """The prompt, if it can be encoded as UTF-8 (both tokenizers need that)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise argparse.ArgumentTypeError(
            f"expected text that can be encoded as UTF-8, got {text!r} "
            f"({error.reason} at position {error.start})"
        ) from None
    return text


def _model_spec(text: str) -> str:
    text = renamed_choice(text, "--model")
    if text in (TOY, "smollm2") or text.endswith(".gguf"):
        return text
    raise argparse.ArgumentTypeError(
        f"expected 'toy', 'smollm2' or a path to a .gguf file, got {text!r}"
    )


def _draft_spec(text: str) -> str:
    text = renamed_choice(text, "--draft-model")
    if text in demo_models.DRAFTERS or text == NGRAM_MODEL:
        return text
    if text == "smollm2" or text.endswith(".gguf"):
        return text
    raise argparse.ArgumentTypeError(
        f"expected {', '.join(map(repr, demo_models.DRAFTERS))}, 'ngram-model', 'smollm2' or "
        f"a path to a .gguf file, got {text!r}"
    )


def configure(demo) -> None:
    """Add the ``demo`` options to its subparser."""
    demo.add_argument(
        "--prompt",
        type=_prompt,
        help="text to continue (default: a Python function header for the n-gram models; "
        "for a GGUF chat model, a task that quotes its input, in the model's chat template)",
    )
    add_max_new_tokens(demo, 200, "tokens to generate")
    add_gamma(demo)
    demo.add_argument(
        "--temperature",
        metavar="T",
        type=number(float, lo=0.0, what="a number >= 0"),
        help="sampling temperature; 0 is greedy (default: 0.8, or 0 for a GGUF model's default "
        "task, which a small model quotes faithfully only when greedy)",
    )
    demo.add_argument(
        "--seed",
        metavar="N",
        type=number(int, lo=0, hi=MAX_SEED, what="an integer in [0, 2**32)"),
        default=0,
        help="random seed (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("cython", "python"),
        help=f"kernel backend (default: {specdec.BACKEND})",
    )
    demo.add_argument(
        "--top-k",
        metavar="K",
        type=number(int, lo=1, what="an integer >= 1"),
        help="keep the k most likely tokens",
    )
    demo.add_argument(
        "--top-p",
        metavar="P",
        type=number(float, lo=0.0, hi=1.0, lo_open=True, what="a number in (0, 1]"),
        help="keep the smallest set holding this much probability",
    )
    demo.add_argument(
        "--min-p",
        metavar="P",
        type=number(float, lo=0.0, hi=1.0, hi_open=True, what="a number in [0, 1)"),
        help="drop tokens less likely than this times the most likely one",
    )
    demo.add_argument(
        "--model",
        type=_model_spec,
        default=TOY,
        metavar="{toy,smollm2,PATH.gguf}",
        help="target model (default: %(default)s: byte-level n-gram models, with their own "
        "draft); "
        "smollm2 and GGUF files need llama-cpp-python",
    )
    demo.add_argument(
        "--draft-model",
        type=_draft_spec,
        metavar="{lookup,lookup+ngram,ngram-model,smollm2,PATH.gguf}",
        help="draft for a GGUF target, sharing its tokenizer (default: lookup, prompt lookup "
        "with an adaptive draft length: it costs nothing); 'lookup+ngram' adds a token n-gram "
        "drafter (NGram) trained on the stdlib; 'ngram-model' is a token trigram draft model "
        "trained on the stdlib "
        "with the target's tokenizer; smollm2 or a GGUF file is a draft model",
    )
    demo.add_argument(
        "--target-latency-ms",
        type=_latency,
        metavar="MS",
        help="simulated extra cost of each target forward pass, standing in for a large model "
        f"(default: {demo_models.DEFAULT_NGRAM_TARGET_LATENCY_MS:g} with n-gram models, "
        "0 otherwise)",
    )
    demo.add_argument(
        "--draft-latency-ms",
        type=_latency,
        default=0.0,
        metavar="MS",
        help="simulated extra cost of each draft forward pass (default: %(default)s)",
    )
    add_threads_option(demo)
    demo.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    demo.add_argument(
        "--json", action="store_true", help="print a JSON report and nothing else on stdout"
    )
    demo.set_defaults(run=run_demo, validate=_validate)


def _gguf_context(args) -> int:
    # A token is at least one byte, so this context holds the prompt, the new
    # tokens and a draft window in flight.
    gamma = args.gamma or MAX_DEFAULT_DRAFT
    return len(args.prompt.encode()) + args.max_new_tokens + gamma + 8


def _validate(args) -> None:
    """Checks that involve several options (argparse checks one at a time)."""
    if args.prompt is None:
        args.prompt = DEFAULT_PROMPT if args.model == TOY else DEFAULT_TASK
    if args.temperature is None:
        args.temperature = 0.0 if args.prompt is DEFAULT_TASK else 0.8
    if args.model == TOY:
        if args.draft_model not in (None, NGRAM_MODEL):
            raise UsageError("--draft-model needs a GGUF --model (smollm2 or PATH.gguf)")
    elif _gguf_context(args) > MAX_GGUF_CONTEXT:
        raise UsageError(
            f"--prompt and --max-new-tokens need a context of {_gguf_context(args)} tokens; "
            f"GGUF models here allow at most {MAX_GGUF_CONTEXT}"
        )


def _stats_dict(stats, wall_time: float) -> dict:
    out = {name: getattr(stats, name) for name in STATS_FIELDS}
    out["accepted_length_histogram"] = [int(x) for x in stats.accepted_length_histogram]
    out["draft_length_histogram"] = [int(x) for x in stats.draft_length_histogram]
    out["drafts_by_source"] = stats.drafts_by_source
    out["acceptance_rate"] = stats.acceptance_rate
    out["tokens_per_step"] = stats.tokens_per_step
    out["wall_time"] = wall_time
    return out


def _timed(label: str, total: int, prompt_len: int, progress_enabled: bool, call):
    """Run ``call(on_call)``, feeding a progress bar from the target's calls.

    Returns the call's result and its wall time in seconds.
    """
    bar = Progress(label, total, progress_enabled)

    def on_target_call(length: int, logits_to_keep):
        # The rows asked for beyond the first are drafts being verified, not
        # tokens generated yet.
        bar.update(length - prompt_len - (logits_to_keep - 1 if logits_to_keep else 0))

    start = time.perf_counter()
    try:
        result = call(on_target_call)
    finally:
        bar.close()
    return result, time.perf_counter() - start


def _exactness(spec_ids, ar_ids, prompt_len: int, temperature: float) -> dict:
    """How the two outputs relate, and what exactness promises about it."""
    spec, ar = list(spec_ids[prompt_len:]), list(ar_ids[prompt_len:])
    first = next((i for i, (a, b) in enumerate(zip(spec, ar, strict=False)) if a != b), None)
    if first is None and len(spec) != len(ar):
        first = min(len(spec), len(ar))  # one run stopped early (end of sequence)
    return {
        "guarantee": "identical" if temperature == 0 else "same distribution",
        "identical": first is None,
        "first_difference": first,
    }


def run_demo(args) -> int:
    """Run ``specdec demo`` (see :func:`configure` for the options).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.

    Returns
    -------
    int
        Exit status.
    """
    quiet = args.json
    if args.model == TOY:
        loaded = demo_models.load_toy_models(quiet)
    else:
        loaded = demo_models.load_llama_models(
            args.model, args.draft_model or "lookup", quiet, _gguf_context(args), args.threads
        )
    prompt_ids = loaded.encode(args.prompt)
    if not prompt_ids:
        raise CLIError("--prompt is empty: the first token needs a prompt to follow")
    target_latency = (
        loaded.default_latency_ms if args.target_latency_ms is None else args.target_latency_ms
    )
    backend = args.backend or specdec.BACKEND
    controls = dict(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p
    )
    progress = not args.no_progress
    draft = loaded.draft
    if not isinstance(draft, Drafter):  # a drafter is no model: nothing to time or slow down
        draft = demo_models.InstrumentedModel(draft, args.draft_latency_ms)

    def target(hook):
        return demo_models.InstrumentedModel(loaded.target, target_latency, hook)

    def fresh_target(hook):
        # Each run starts from an empty cache, so that neither gets the other's prompt
        # evaluation for free.
        if hasattr(loaded.target, "reset"):
            loaded.target.reset()
        return target(hook)

    stops = loaded.stop_token_ids
    eos = stops[0] if stops else None  # the loops stop there; TextStream at any stop id
    streamed = not args.json
    if streamed:  # the speculative run is shown as it is made: the text is its progress
        header = demo_report.header_lines(backend, loaded.description, args.prompt, prompt_ids)
        print("\n".join(header))
        print(
            "--- prompt + speculative decoding, streamed as it is made ---\n"
            + printable(args.prompt + demo_report.reply_separator(loaded.info)),
            end="",
        )
    try:
        # One short untimed run first: a model's first calls page its weights in.
        specdec.sample(loaded.target, prompt_ids, 2, temperature=0.0, backend=backend)
        if not isinstance(loaded.draft, Drafter):  # a draft model pages its weights in too
            specdec.sample(loaded.draft, prompt_ids, 2, temperature=0.0, backend=backend)
        runs.calibrate(loaded.target, quiet)
        decoder = specdec.SpeculativeDecoder(
            args.gamma, seed=args.seed, backend=backend, **controls
        )
        try:
            (spec_new, spec_stats), spec_time = _timed(
                "speculative   ",
                args.max_new_tokens,
                len(prompt_ids),
                progress and not streamed,
                lambda hook: runs.text_of(
                    decoder.stream(draft, fresh_target(hook), prompt_ids, args.max_new_tokens, eos),
                    loaded.decode,
                    stops,
                    demo_report.write if streamed else None,
                ),
            )
        finally:
            if streamed:
                print(flush=True)
        (ar_new, ar_stats), ar_time = _timed(
            "autoregressive",
            args.max_new_tokens,
            len(prompt_ids),
            progress,
            lambda hook: runs.text_of(
                runs.plain_stream(
                    fresh_target(hook),
                    prompt_ids,
                    args.max_new_tokens,
                    eos,
                    controls,
                    args.seed,
                    backend,
                ),
                loaded.decode,
                stops,
            ),
        )
        spec_ids, ar_ids = list(prompt_ids) + spec_new, list(prompt_ids) + ar_new
    except (ValueError, ImportError) as error:
        # What the decoder reports about its inputs (a prompt id outside the
        # vocabulary, a backend this install lacks); a TypeError would be a
        # bug here, and keeps its traceback.
        raise CLIError(str(error)) from None

    report = {
        "specdec_version": specdec.__version__,
        "backend": backend,
        "model": {"name": args.model, "description": loaded.description, **loaded.info},
        "settings": {
            # the effective value, also when not given
            "gamma": decoder.max_draft_tokens(loaded.draft),
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            **controls,
            "target_latency_ms": target_latency,
            "draft_latency_ms": args.draft_latency_ms,
        },
        "prompt": args.prompt,
        "prompt_tokens": len(prompt_ids),
        "speculative": {
            "text": loaded.decode(spec_ids[len(prompt_ids) :]),
            **_stats_dict(spec_stats, spec_time),
        },
        "autoregressive": {
            "text": loaded.decode(ar_ids[len(prompt_ids) :]),
            **_stats_dict(ar_stats, ar_time),
        },
        "exactness": _exactness(spec_ids, ar_ids, len(prompt_ids), args.temperature),
        "speedup": ar_time / spec_time if spec_time > 0 else None,
    }
    if args.json:
        print_json(report)
    else:
        demo_report.print_demo(report, streamed=streamed)
    return 0
