"""The public API: a drop-in for the reference loop, its return values and its contracts.

* Signatures of ``SpeculativeDecoder.__init__`` and ``generate`` match the reference
  loop's (names, order, defaults; new options keyword-only), and the stats dataclass
  carries the reference's four fields and two properties.
* Return values: a list of Python ints that starts with the prompt, and the stats.
* The model protocol: ``forward`` objects and plain callables, float32 / float64 /
  mixed logits, ``logits_to_keep``, read-only int64 ids.
* Statistics invariants over many seeded runs, budgets (0, < gamma), EOS.
* Reproducibility: ``seed=``, ``rng=`` (Generator or int), ``np.random.seed``.
* Identical draft and target: every draft is accepted.
* Parity with the reference loop where it is distribution-free: identical models,
  forced (one-hot) models, and near-greedy decoding.

Every behavioural test runs on both backends (``backend`` fixture).  The reference
loop is imported by path (the ``reference_path`` fixture of conftest.py: ``--reference``,
``SPECDEC_REFERENCE``, or ``shared/reference/`` beside the repository); its tests skip
when it is absent.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect

import numpy as np
import pytest
from law_models import ContextModel

from specdec import SpeculativeDecoder, SpeculativeDecodingStats, sample
from specdec._verifier import Verifier

DTYPES = [np.float32, np.float64]


# --- helpers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(reference_path):
    """The reference loop's module, imported by path (never copied into the project)."""
    spec = importlib.util.spec_from_file_location("_specdec_reference_loop", reference_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def global_numpy_state():
    """Restore NumPy's global random state after a test that seeds it."""
    state = np.random.get_state()
    yield
    np.random.set_state(state)


class Counting:
    """A model wrapper that counts calls and records the ids it was given (copied)."""

    def __init__(self, model):
        self.model = model
        self.calls = 0
        self.lengths = []

    def forward(self, ids):
        self.calls += 1
        self.lengths.append(ids.shape[1])
        return self.model.forward(ids)


class Keeping:
    """A model with ``logits_to_keep`` that records the counts it is asked for."""

    def __init__(self, model, extra_rows=0):
        self.model = model
        self.keeps = []
        self.extra_rows = extra_rows

    def forward(self, ids, logits_to_keep=None):
        self.keeps.append(logits_to_keep)
        full = self.model.forward(ids)
        if logits_to_keep is None:
            return full
        return full[:, full.shape[1] - logits_to_keep - self.extra_rows :]


class ForcedModel:
    """One-hot logits: the next token is ``rule(sequence)`` with probability 1.

    Every other logit is -inf, so speculative decoding has no randomness left: a
    draft token is kept iff it equals the target's forced token, and a rejection
    always yields the target's token.
    """

    def __init__(self, vocab_size, rule, dtype=np.float64):
        self.vocab_size = vocab_size
        self.rule = rule
        self.dtype = dtype

    def forward(self, ids):
        ids = np.asarray(ids)[0]
        out = np.full((1, len(ids), self.vocab_size), -np.inf, dtype=self.dtype)
        for i in range(len(ids)):
            out[0, i, self.rule(ids[: i + 1])] = 0.0
        return out


def target_rule(seq):
    return (3 * int(seq[-1]) + len(seq)) % 7


def draft_rule(seq):
    """The target's rule, except in every third context."""
    token = target_rule(seq)
    return (token + 1) % 7 if (int(seq[-1]) + len(seq)) % 3 == 0 else token


def counts_of(stats):
    return (
        stats.total_tokens_generated,
        stats.total_draft_tokens_proposed,
        stats.total_draft_tokens_accepted,
        stats.num_target_forward_passes,
        stats.num_draft_forward_passes,
        list(stats.accepted_length_histogram),
    )


def check_stats(ids, prompt, stats, gamma, max_new_tokens, eos=None, draft=None, target=None):
    """Every invariant a run's statistics must satisfy."""
    new = ids[len(prompt) :]
    assert ids[: len(prompt)] == list(prompt)
    assert len(new) <= max_new_tokens
    assert stats.total_tokens_generated == len(new)
    assert 0 <= stats.total_draft_tokens_accepted <= stats.total_draft_tokens_proposed
    assert stats.num_draft_forward_passes == stats.total_draft_tokens_proposed
    histogram = stats.accepted_length_histogram
    assert len(histogram) == gamma + 1
    assert all(h >= 0 for h in histogram)
    assert sum(histogram) == stats.num_target_forward_passes
    assert sum(k * h for k, h in enumerate(histogram)) == stats.total_draft_tokens_accepted
    # each pass proposes 1..gamma drafts and adds 1..gamma+1 tokens
    passes = stats.num_target_forward_passes
    assert passes <= stats.total_draft_tokens_proposed <= gamma * passes
    assert passes <= stats.total_tokens_generated <= (gamma + 1) * passes
    if passes:
        assert stats.tokens_per_step == stats.total_tokens_generated / passes
        assert stats.acceptance_rate == (
            stats.total_draft_tokens_accepted / stats.total_draft_tokens_proposed
        )
        assert 0.0 <= stats.acceptance_rate <= 1.0
    else:
        assert stats.tokens_per_step == 0.0 and stats.acceptance_rate == 0.0
    assert stats.draft_time >= 0 and stats.target_time >= 0 and stats.decoder_time >= 0
    assert stats.wall_time == pytest.approx(
        stats.draft_time + stats.target_time + stats.decoder_time
    )
    if eos is not None and eos in new:
        assert new.index(eos) == len(new) - 1, "EOS must end the generation"
    elif max_new_tokens > 0:
        assert len(new) == max_new_tokens, "stopped early without EOS"
    if draft is not None:
        assert draft.calls == stats.num_draft_forward_passes
    if target is not None:
        assert target.calls == stats.num_target_forward_passes


# --- drop-in signatures ------------------------------------------------------------------


def _split(signature):
    params = [p for p in signature.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword_only = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return positional, keyword_only


@pytest.mark.parametrize("method", ["__init__", "generate"])
def test_signature_is_the_references(reference, method):
    ours = inspect.signature(getattr(SpeculativeDecoder, method))
    theirs = inspect.signature(getattr(reference.SpeculativeDecoder, method))
    positional, keyword_only = _split(ours)
    ref_positional, ref_keyword_only = _split(theirs)
    assert not ref_keyword_only
    assert [p.name for p in positional] == [p.name for p in ref_positional]
    # gamma=None is the draft sources' own limit: the reference's 4 for a draft model
    # (test_gamma_default_is_the_references_for_a_draft_model), a drafter's num_tokens
    ours_defaults = [None if p.name == "gamma" else p.default for p in positional]
    theirs = [None if p.name == "gamma" else p.default for p in ref_positional]
    assert ours_defaults == theirs
    assert [p.kind for p in positional] == [p.kind for p in ref_positional]
    # options the reference lacks are keyword-only, with defaults (drop-in calls work)
    assert all(p.default is not inspect.Parameter.empty for p in keyword_only)


def test_gamma_default_is_the_references_for_a_draft_model(reference, backend):
    draft, target = ContextModel(6, seed=1), ContextModel(6, seed=2)
    assert reference.SpeculativeDecoder().gamma == 4
    decoder = SpeculativeDecoder(draft_length="fixed", backend=backend)
    assert decoder.max_draft_tokens(draft) == 4
    _, stats = decoder.generate(draft, target, [1, 2], 20, rng=0)
    assert len(stats.accepted_length_histogram) == 5  # 0..4 kept, as the reference's


def test_signature_options():
    _, init_options = _split(inspect.signature(SpeculativeDecoder.__init__))
    _, generate_options = _split(inspect.signature(SpeculativeDecoder.generate))
    assert {p.name for p in init_options} >= {"seed", "top_k", "top_p", "min_p", "backend"}
    assert [p.name for p in generate_options] == ["rng", "streamer"]


def test_stats_dataclass_has_the_references_fields_and_properties(reference):
    assert dataclasses.is_dataclass(SpeculativeDecodingStats)
    ref_fields = [
        (f.name, f.default) for f in dataclasses.fields(reference.SpeculativeDecodingStats)
    ]
    ours = [(f.name, f.default) for f in dataclasses.fields(SpeculativeDecodingStats)]
    assert len(ref_fields) == 4
    assert ours[:4] == ref_fields
    for name in ("acceptance_rate", "tokens_per_step"):
        assert isinstance(getattr(reference.SpeculativeDecodingStats, name), property)
        assert isinstance(getattr(SpeculativeDecodingStats, name), property)
    # same values on the same counts, including the zero cases
    for counts in [(0, 0, 0, 0), (7, 8, 5, 3), (1, 4, 0, 1)]:
        a, b = SpeculativeDecodingStats(*counts), reference.SpeculativeDecodingStats(*counts)
        assert a.acceptance_rate == b.acceptance_rate
        assert a.tokens_per_step == b.tokens_per_step


def test_positional_call_like_the_reference(backend):
    draft, target = ContextModel(6, seed=1), ContextModel(6, seed=2)
    ids, stats = SpeculativeDecoder(3, 0.8, seed=0, backend=backend).generate(
        draft, target, [1, 2], 9, 4
    )
    check_stats(ids, [1, 2], stats, 3, 9, eos=4)


# --- return values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    [
        [3, 1, 4],
        (3, 1, 4),
        np.array([3, 1, 4]),
        np.array([3, 1, 4], dtype=np.int32),
        np.array([3, 1, 4], dtype=np.uint8),
    ],
)
def test_returns_a_list_of_python_ints_with_the_prompt(backend, prompt):
    draft, target = ContextModel(5, seed=1), ContextModel(5, seed=2)
    ids, stats = SpeculativeDecoder(4, seed=0, backend=backend).generate(draft, target, prompt, 12)
    assert type(ids) is list
    assert all(type(token) is int for token in ids)
    assert ids[:3] == [3, 1, 4] and len(ids) == 15
    assert all(0 <= token < 5 for token in ids)
    assert isinstance(stats, SpeculativeDecodingStats)
    for f in dataclasses.fields(stats):
        value = getattr(stats, f.name)
        assert type(value) in (int, float, list, dict), (f.name, type(value))
    assert all(type(h) is int for h in stats.accepted_length_histogram)
    assert all(type(h) is int for h in stats.draft_length_histogram)
    assert all(
        type(n) is int for counts in stats.drafts_by_source.values() for n in counts.values()
    )


def test_prompt_is_not_modified(backend):
    prompt = [1, 2, 3]
    array = np.array(prompt)
    SpeculativeDecoder(2, seed=0, backend=backend).generate(
        ContextModel(5, seed=1), ContextModel(5, seed=2), prompt, 5
    )
    SpeculativeDecoder(2, seed=0, backend=backend).generate(
        ContextModel(5, seed=1), ContextModel(5, seed=2), array, 5
    )
    assert prompt == [1, 2, 3] and array.tolist() == [1, 2, 3]


def test_sample_returns_the_same_kinds(backend):
    ids, stats = sample(ContextModel(5, seed=2), [0, 1], 7, seed=3, backend=backend)
    assert type(ids) is list and all(type(t) is int for t in ids) and len(ids) == 9
    assert stats.total_tokens_generated == stats.num_target_forward_passes == 7
    assert stats.total_draft_tokens_proposed == stats.num_draft_forward_passes == 0


# --- model forms and dtypes -------------------------------------------------------------


def _forms(model):
    class WithForward:
        def forward(self, ids):
            return model.forward(ids)

    class CallableObject:
        def __call__(self, ids):
            return model.forward(ids)

    def function(ids):
        return model.forward(ids)

    return {
        "forward": WithForward(),
        "callable_object": CallableObject(),
        "function": function,
        "lambda": lambda ids: model.forward(ids),
        "bound_method": model.forward,
    }


@pytest.mark.parametrize(
    "form", ["forward", "callable_object", "function", "lambda", "bound_method"]
)
def test_model_forms_give_the_same_tokens(backend, form):
    draft, target = ContextModel(6, seed=1), ContextModel(6, seed=2)
    decoder = SpeculativeDecoder(3, 0.9, backend=backend)
    expected = decoder.generate(draft, target, [1], 20, rng=5)
    got = decoder.generate(_forms(draft)[form], _forms(target)[form], [1], 20, rng=5)
    assert got[0] == expected[0]
    assert counts_of(got[1]) == counts_of(expected[1])


def test_forward_wins_over_call(backend):
    class Both:
        def __init__(self, model):
            self.model, self.forward_calls, self.call_calls = model, 0, 0

        def forward(self, ids):
            self.forward_calls += 1
            return self.model.forward(ids)

        def __call__(self, ids):
            self.call_calls += 1
            return self.model.forward(ids)

    draft, target = Both(ContextModel(5, seed=1)), Both(ContextModel(5, seed=2))
    SpeculativeDecoder(2, seed=0, backend=backend).generate(draft, target, [1], 6)
    assert draft.forward_calls > 0 and target.forward_calls > 0
    assert draft.call_calls == target.call_calls == 0


@pytest.mark.parametrize("draft_dtype", DTYPES)
@pytest.mark.parametrize("target_dtype", DTYPES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_float32_float64_and_mixed_logits(backend, draft_dtype, target_dtype, temperature):
    draft = Counting(ContextModel(7, seed=11, dtype=draft_dtype))
    target = Counting(ContextModel(7, seed=12, dtype=target_dtype))
    ids, stats = SpeculativeDecoder(3, temperature, backend=backend).generate(
        draft, target, [2, 5], 25, rng=1
    )
    assert all(0 <= t < 7 for t in ids)
    check_stats(ids, [2, 5], stats, 3, 25, draft=draft, target=target)
    if temperature == 0.0:  # greedy: the target's own argmax chain, whatever the dtypes
        sequence = [2, 5]
        for _ in range(25):
            sequence.append(int(np.argmax(target.model.next_logits(sequence))))
        assert ids == sequence


# --- logits_to_keep ----------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_to_keep_counts(backend, gamma, temperature):
    draft = Keeping(ContextModel(6, seed=21))
    target = Keeping(ContextModel(6, seed=22))
    decoder = SpeculativeDecoder(gamma, temperature, backend=backend)
    ids, stats = decoder.generate(draft, target, [0, 3], 30, eos_token_id=None, rng=9)
    assert draft.keeps == [1] * stats.num_draft_forward_passes
    assert len(target.keeps) == stats.num_target_forward_passes
    assert all(2 <= k <= gamma + 1 for k in target.keeps)
    # keep = drafts of the pass + 1: the keeps add up to the drafts proposed
    assert sum(k - 1 for k in target.keeps) == stats.total_draft_tokens_proposed
    # and the trailing rows are the right ones: same run as with full logits
    full_ids, full_stats = decoder.generate(
        ContextModel(6, seed=21), ContextModel(6, seed=22), [0, 3], 30, rng=9
    )
    assert ids == full_ids and counts_of(stats) == counts_of(full_stats)


def test_logits_to_keep_in_sample(backend):
    target = Keeping(ContextModel(6, seed=22))
    ids, _ = sample(target, [1], 8, seed=4, backend=backend)
    assert target.keeps == [1] * 8
    assert ids == sample(ContextModel(6, seed=22), [1], 8, seed=4, backend=backend)[0]


@pytest.mark.parametrize("which", ["draft", "target"])
@pytest.mark.parametrize("extra_rows", [1, 100])  # one row too many / all rows
def test_logits_to_keep_wrong_row_count_is_a_clear_error(backend, which, extra_rows):
    models = {"draft": ContextModel(6, seed=21), "target": ContextModel(6, seed=22)}
    models[which] = Keeping(models[which], extra_rows=extra_rows)
    with pytest.raises(ValueError, match=rf"{which}_model.*logits_to_keep"):
        SpeculativeDecoder(3, backend=backend).generate(
            models["draft"], models["target"], list(range(5)) * 30, 10, rng=0
        )


def test_logits_to_keep_keyword_only_is_detected(backend):
    class KwOnly:
        def __init__(self, model):
            self.model, self.keeps = model, []

        def forward(self, ids, *, logits_to_keep):
            self.keeps.append(logits_to_keep)
            return self.model.forward(ids)[:, -logits_to_keep:]

    draft, target = KwOnly(ContextModel(5, seed=1)), KwOnly(ContextModel(5, seed=2))
    ids, stats = SpeculativeDecoder(2, backend=backend).generate(draft, target, [1, 2], 6, rng=0)
    assert set(draft.keeps) == {1} and len(target.keeps) == stats.num_target_forward_passes


# --- what a model sees -------------------------------------------------------------------


def test_models_get_read_only_int64_ids(backend):
    seen = []

    class Inspecting:
        def __init__(self, model, name):
            self.model, self.name = model, name

        def forward(self, ids):
            assert isinstance(ids, np.ndarray)
            assert ids.dtype == np.int64 and ids.ndim == 2 and ids.shape[0] == 1
            assert not ids.flags.writeable
            with pytest.raises(ValueError):
                ids[0, 0] = 1
            with pytest.raises(ValueError):
                ids[0, -1] += 1
            with pytest.raises(ValueError):  # and cannot be made writable again
                ids.flags.writeable = True
            with pytest.raises(ValueError):
                ids.base.flags.writeable = True
            seen.append((self.name, ids.tolist()[0]))
            return self.model.forward(ids)

    prompt = [4, 0, 2]
    ids, stats = SpeculativeDecoder(3, backend=backend).generate(
        Inspecting(ContextModel(5, seed=1), "d"),
        Inspecting(ContextModel(5, seed=2), "t"),
        prompt,
        12,
        rng=3,
    )
    assert len(seen) == stats.num_draft_forward_passes + stats.num_target_forward_passes
    for _name, sequence in seen:
        assert sequence[:3] == prompt and all(0 <= t < 5 for t in sequence)
    # the last target call saw the final sequence up to its last (at most gamma) drafts
    last_target = [s for n, s in seen if n == "t"][-1]
    start = len(last_target) - 3
    assert ids[:start] == last_target[:start] and len(ids) <= len(last_target) + 1


def test_ids_are_a_view_valid_during_the_call_only(backend):
    """Documented: models get read-only views of the decoder's one token buffer (no
    per-call array), valid during their call; a model keeping ``ids`` must copy them."""

    class Keeper:
        def __init__(self, model):
            self.model, self.kept = model, []

        def forward(self, ids):
            assert not ids.flags.writeable and ids.base is not None
            self.kept.append(ids.copy())
            return self.model.forward(ids)

    draft, target = Keeper(ContextModel(5, seed=1)), Keeper(ContextModel(5, seed=2))
    ids, _ = SpeculativeDecoder(4, backend=backend).generate(draft, target, [1, 2], 30, rng=0)
    # the target's calls saw the accepted text: each call's sequence, up to the drafts of
    # its step, is a prefix of the final output
    for seen in target.kept:
        accepted = seen[0, :-4] if seen.shape[1] > 6 else seen[0, :2]
        assert ids[: len(accepted)] == accepted.tolist()


# --- statistics --------------------------------------------------------------------------


def test_stats_invariants_over_many_seeded_runs(backend):
    master = np.random.default_rng(2024)
    eos_hits = 0
    for run in range(60):
        vocab = int(master.integers(2, 9))
        gamma = int(master.integers(1, 8))
        temperature = float(master.choice([0.0, 0.4, 1.0, 1.8]))
        max_new_tokens = int(master.integers(0, 25))
        eos = int(master.integers(0, vocab)) if run % 2 else None
        prompt = master.integers(0, vocab, size=int(master.integers(1, 4))).tolist()
        draft = Counting(ContextModel(vocab, seed=run))
        target = Counting(ContextModel(vocab, seed=run + 1000))
        ids, stats = SpeculativeDecoder(gamma, temperature, backend=backend).generate(
            draft, target, prompt, max_new_tokens, eos, rng=run
        )
        check_stats(ids, prompt, stats, gamma, max_new_tokens, eos, draft, target)
        eos_hits += eos is not None and eos in ids[len(prompt) :]
    assert eos_hits > 5  # the EOS branch of the invariants was exercised


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3])
def test_max_new_tokens_below_gamma(backend, max_new_tokens):
    for temperature in (0.0, 1.0):
        for seed in range(10):
            draft = Keeping(ContextModel(5, seed=1))
            target = Keeping(ContextModel(5, seed=2))
            ids, stats = SpeculativeDecoder(8, temperature, backend=backend).generate(
                draft, target, [1], max_new_tokens, rng=seed
            )
            assert len(ids) == 1 + max_new_tokens
            assert (
                stats.total_draft_tokens_proposed
                <= max_new_tokens + (stats.num_target_forward_passes - 1) * 8
            )
            assert all(k <= max_new_tokens + 1 for k in target.keeps)
            check_stats(ids, [1], stats, 8, max_new_tokens)


# --- reproducibility ----------------------------------------------------------------------


def _run(backend, **kwargs):
    rng = kwargs.pop("rng", None)
    decoder = SpeculativeDecoder(3, 1.0, backend=backend, **kwargs)
    return decoder.generate(
        ContextModel(40, seed=5, scale=0.7),
        ContextModel(40, seed=6, scale=0.7),
        [1, 2],
        40,
        rng=rng,
    )


def test_same_seed_same_tokens(backend):
    a, b = _run(backend, seed=7), _run(backend, seed=7)
    assert a[0] == b[0] and counts_of(a[1]) == counts_of(b[1])
    assert _run(backend, seed=8)[0] != a[0]


def test_decoder_seed_is_one_stream_across_calls(backend):
    decoder = SpeculativeDecoder(3, backend=backend, seed=11)
    draft, target = ContextModel(40, seed=5, scale=0.7), ContextModel(40, seed=6, scale=0.7)
    first = decoder.generate(draft, target, [1, 2], 40)[0]
    second = decoder.generate(draft, target, [1, 2], 40)[0]
    assert first != second  # the generator moved on
    again = SpeculativeDecoder(3, backend=backend, seed=11)
    assert again.generate(draft, target, [1, 2], 40)[0] == first
    assert again.generate(draft, target, [1, 2], 40)[0] == second
    # a Generator as the seed is used as is
    assert _run(backend, seed=np.random.default_rng(11))[0] == first


def test_generate_rng_int_and_generator(backend):
    by_int = _run(backend, rng=21)
    by_generator = _run(backend, rng=np.random.default_rng(21))
    assert by_int[0] == by_generator[0]
    assert _run(backend, rng=22)[0] != by_int[0]
    # rng= wins over the decoder's seed
    assert _run(backend, seed=99, rng=21)[0] == by_int[0]


@pytest.mark.parametrize("seed, error", [(-1, ValueError), ("7", TypeError), (1.5, TypeError)])
def test_sample_refuses_a_bad_seed_even_when_rng_wins(backend, seed, error):
    model = ContextModel(40, seed=6, scale=0.7)
    with pytest.raises(error, match="seed must be a"):
        sample(model, [1, 2], 5, seed=seed, rng=3, backend=backend)


def test_np_random_seed_reproduces(backend, global_numpy_state):
    np.random.seed(1234)
    a = _run(backend)
    np.random.seed(1234)
    b = _run(backend)
    np.random.seed(4321)
    c = _run(backend)
    assert a[0] == b[0] and counts_of(a[1]) == counts_of(b[1])
    assert a[0] != c[0]


def test_runs_do_not_depend_on_runs_beside_them(backend):
    alone = _run(backend, rng=np.random.default_rng(5))[0]
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(6)
    decoder = SpeculativeDecoder(3, 1.0, backend=backend)
    draft, target = ContextModel(40, seed=5, scale=0.7), ContextModel(40, seed=6, scale=0.7)
    decoder.generate(draft, target, [3], 10, rng=rng_b)
    interleaved = decoder.generate(draft, target, [1, 2], 40, rng=rng_a)[0]
    assert interleaved == alone


def test_sample_reproducibility(backend, global_numpy_state):
    target = ContextModel(40, seed=6, scale=0.7)
    a = sample(target, [1], 30, seed=3, backend=backend)[0]
    assert sample(target, [1], 30, seed=3, backend=backend)[0] == a
    assert sample(target, [1], 30, rng=3, backend=backend)[0] == a
    assert sample(target, [1], 30, rng=np.random.default_rng(3), backend=backend)[0] == a
    assert sample(target, [1], 30, seed=4, backend=backend)[0] != a
    np.random.seed(77)
    b = sample(target, [1], 30, backend=backend)[0]
    np.random.seed(77)
    assert sample(target, [1], 30, backend=backend)[0] == b
    np.random.seed(78)
    assert sample(target, [1], 30, backend=backend)[0] != b


# --- identical models --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "controls",
    [{}, {"top_k": 3}, {"top_p": 0.7}, {"min_p": 0.1}, {"top_k": 5, "top_p": 0.9, "min_p": 0.05}],
)
def test_identical_models_accept_every_draft(backend, dtype, controls):
    """p == q > 0 at every draft token, and u * q < p holds for every u in [0, 1)."""
    for seed in range(8):
        for temperature in (0.0, 0.3, 1.0, 2.5):
            model = ContextModel(8, seed=seed, dtype=dtype, scale=2.5)
            twin = ContextModel(8, seed=seed, dtype=dtype, scale=2.5)
            gamma = 1 + seed % 6
            ids, stats = SpeculativeDecoder(
                gamma, temperature, backend=backend, **controls
            ).generate(model, twin, [seed % 8], 30, rng=seed)
            assert stats.total_draft_tokens_accepted == stats.total_draft_tokens_proposed
            assert stats.acceptance_rate == 1.0
            # every pass but a budget-truncated last one keeps all gamma drafts
            assert sum(stats.accepted_length_histogram[:gamma]) <= 1
            # the same object as both models
            _, same = SpeculativeDecoder(gamma, temperature, backend=backend, **controls).generate(
                model, model, [1], 20, rng=seed
            )
            assert same.acceptance_rate == 1.0


# --- parity with the reference loop (distribution-free cases) -------------------------------


def test_reference_and_specdec_accept_everything_with_identical_models(
    reference, backend, global_numpy_state
):
    for seed in range(5):
        model = ContextModel(6, seed=seed, scale=1.0)
        np.random.seed(seed)
        ref_ids, ref_stats = reference.SpeculativeDecoder(4, 1.0).generate(model, model, [1], 21)
        ids, stats = SpeculativeDecoder(4, 1.0, verification="token", backend=backend).generate(
            model, model, [1], 21, rng=seed
        )
        for s, n in ((ref_stats, len(ref_ids)), (stats, len(ids))):
            assert s.acceptance_rate == 1.0 and n == 22
        # no rejections: 21 tokens = 4 passes of 4 + bonus, then 1 drafted token
        assert (
            (ref_stats.num_target_forward_passes, ref_stats.total_draft_tokens_proposed)
            == (stats.num_target_forward_passes, stats.total_draft_tokens_proposed)
            == (5, 17)
        )


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
@pytest.mark.parametrize("eos", [None, 4])
@pytest.mark.parametrize("max_new_tokens", [1, 7, 16])
def test_forced_outcome_matches_the_reference(
    reference, backend, gamma, eos, max_new_tokens, global_numpy_state
):
    """One-hot logits force every decision: same tokens and the same four stats."""
    np.random.seed(0)
    for dtype in DTYPES:
        draft, target = ForcedModel(7, draft_rule, dtype), ForcedModel(7, target_rule, dtype)
        ref_ids, ref_stats = reference.SpeculativeDecoder(gamma, 1.0).generate(
            draft, target, [2, 5], max_new_tokens, eos
        )
        ids, stats = SpeculativeDecoder(gamma, 1.0, verification="token", backend=backend).generate(
            draft, target, [2, 5], max_new_tokens, eos, rng=0
        )
        assert ids == ref_ids
        assert dataclasses.astuple(ref_stats) == counts_of(stats)[:4]
        check_stats(ids, [2, 5], stats, gamma, max_new_tokens, eos=eos)
    # the case is not trivial: some drafts are rejected, some kept
    if max_new_tokens == 16:
        assert 0 < stats.total_draft_tokens_accepted < stats.total_draft_tokens_proposed


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_matches_the_references_near_greedy(reference, backend, gamma, global_numpy_state):
    """The reference clamps temperature 0 to 1e-5; with well-separated maxima that is
    greedy decoding (runner-ups get weight < exp(-100)), so tokens and stats agree."""

    def separated(model):  # no near-ties at the maximum of any row
        top2 = np.sort(model.table, axis=-1)[..., -2:]
        return np.min(top2[..., 1] - top2[..., 0]) > 1e-3

    models = (ContextModel(6, seed=s, scale=1.5) for s in range(100, 200))
    models = [m for m in models if separated(m)][:8]
    assert len(models) == 8
    for seed in range(4):
        draft, target = models[2 * seed], models[2 * seed + 1]
        np.random.seed(seed)
        ref_ids, ref_stats = reference.SpeculativeDecoder(gamma, 0.0).generate(
            draft, target, [0, 1], 24, 5
        )
        ids, stats = SpeculativeDecoder(gamma, 0.0, verification="token", backend=backend).generate(
            draft, target, [0, 1], 24, 5
        )
        assert ids == ref_ids
        assert dataclasses.astuple(ref_stats) == counts_of(stats)[:4]


# --- budgets, draft weights, dtypes ------------------------------------------------------------


class _EosFirst:
    """Forces EOS (token 3) as the first new token."""

    vocab_size = 4

    def forward(self, ids):
        out = np.full((1, ids.shape[1], 4), -np.inf)
        out[..., 3] = 0.0
        return out


def test_large_budget_with_early_eos_reference_behaviour(reference, global_numpy_state):
    """The reference handles a huge budget that EOS cuts short (it appends to a list)."""
    np.random.seed(0)
    ids, _ = reference.SpeculativeDecoder(2, 1.0).generate(_EosFirst(), _EosFirst(), [1], 10**12, 3)
    assert ids == [1, 3]


def test_large_budget_with_early_eos(backend):
    ids, _ = SpeculativeDecoder(2, backend=backend).generate(
        _EosFirst(), _EosFirst(), [1], 10**12, 3, rng=0
    )
    assert ids == [1, 3]


class _SpyKernels:
    """Wraps a kernel module: records the draft weights sample_token produced and the
    draft weights verify was given (arguments found by name, not position)."""

    def __init__(self, kernels):
        self.kernels = kernels
        self.Workspace = kernels.Workspace
        self.produced, self.verified = [], []

    def sample_token(self, *args):
        token = self.kernels.sample_token(*args)
        bound = inspect.signature(self.kernels.sample_token).bind(*args).arguments
        self.produced.append(np.array(bound["weights_out"], dtype=np.float64))
        return token

    def verify(self, *args):
        bound = inspect.signature(self.kernels.verify).bind(*args).arguments
        n = len(bound["draft_tokens"])
        self.verified.extend(np.array(bound["draft_weights"][:n], dtype=np.float64))
        return self.kernels.verify(*args)


def test_verify_gets_the_draft_weights_sample_token_made(backend):
    decoder = SpeculativeDecoder(4, 1.0, backend=backend)
    decoder._verifier = verifier = Verifier(backend)  # its own: the shared one stays clean
    verifier.kernels = spy = _SpyKernels(verifier.kernels)
    decoder.generate(ContextModel(6, seed=3), ContextModel(6, seed=4), [1, 2], 30, rng=0)
    # every verified draft row is the one produced for it (passes line up in order)
    assert len(spy.produced) == len(spy.verified) > 0
    for made, used in zip(spy.produced, spy.verified, strict=False):
        assert np.array_equal(made, used)


def test_draft_changing_dtype_between_calls(backend):
    class Alternating:
        def __init__(self, model):
            self.model, self.n = model, 0

        def forward(self, ids):
            self.n += 1
            return self.model.forward(ids).astype(np.float32 if self.n % 2 else np.float64)

    # a model must keep one logits dtype: a change is a clear error, never a wrong q
    decoder = SpeculativeDecoder(4, 1.0, backend=backend)
    with pytest.raises(TypeError, match="draft_model returned float64 logits after float32"):
        decoder.generate(
            Alternating(ContextModel(6, seed=3, dtype=np.float32)),
            ContextModel(6, seed=4),
            [1, 2],
            30,
            rng=0,
        )
