"""Bad input gets a clear error that names the argument, raised before any work.

Models are wrapped so that their calls are counted: wherever the problem is knowable
before a model runs, the tests require that no model ran.  Problems that only the
models' output can reveal (wrong shapes, dtypes, NaN logits, a vocabulary known only
from the logits) must be reported on the first offending call, naming the model and,
for bad logits, the sequence position.

Every test that runs the decoder runs on both backends (``backend`` fixture).
"""

from __future__ import annotations

import numpy as np
import pytest
from law_models import ContextModel

from specdec import SpeculativeDecoder, sample


class Model:
    """A cheap model that never fails on odd ids: logits = table[id % V, position % 3].

    Counts its calls; declares ``vocab_size`` unless told not to; ``edit(logits,
    ids)`` may corrupt the output.
    """

    def __init__(self, vocab=5, seed=0, *, declare=True, dtype=np.float64, edit=None):
        rng = np.random.default_rng(seed)
        self.table = (1.5 * rng.standard_normal((vocab, 3, vocab))).astype(dtype)
        self.vocab = vocab
        if declare:
            self.vocab_size = vocab
        self.calls = 0
        self.edit = edit

    def forward(self, ids):
        self.calls += 1
        ids = np.asarray(ids)[0]
        out = self.table[ids % self.vocab, np.arange(len(ids)) % 3][np.newaxis]
        return self.edit(out, ids) if self.edit is not None else out


def models(**kwargs):
    return Model(seed=1, **kwargs), Model(seed=2, **kwargs)


def no_calls(*ms):
    return all(m.calls == 0 for m in ms)


def _stable_repr(value) -> str:
    """A test id that is the same in every process (no object address in it)."""
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


# --- constructor arguments ----------------------------------------------------------------

BAD_INIT = [
    ({"gamma": 0}, ValueError),
    ({"gamma": -3}, ValueError),
    ({"gamma": 2.0}, TypeError),
    ({"gamma": True}, TypeError),
    ({"gamma": "4"}, TypeError),
    ({"gamma": [4]}, TypeError),  # None is the default: the draft sources' own
    ({"gamma": np.float64(2)}, TypeError),
    ({"gamma": 1e8}, TypeError),
    ({"gamma": 10**8}, ValueError),
    ({"gamma": 2**62}, ValueError),
    ({"gamma": 2**63}, ValueError),
    ({"gamma": 2**64 + 1}, ValueError),
    ({"temperature": -0.5}, ValueError),
    ({"temperature": float("nan")}, ValueError),
    ({"temperature": float("inf")}, ValueError),
    ({"temperature": -float("inf")}, ValueError),
    ({"temperature": np.float32("nan")}, ValueError),
    ({"temperature": 1e-320}, ValueError),
    ({"temperature": "1"}, TypeError),
    ({"temperature": None}, TypeError),
    ({"temperature": 1j}, TypeError),
    ({"temperature": True}, TypeError),
    ({"top_k": 0}, ValueError),
    ({"top_k": -2}, ValueError),
    ({"top_k": 2.5}, TypeError),
    ({"top_k": 2.0}, TypeError),
    ({"top_k": True}, TypeError),
    ({"top_k": "3"}, TypeError),
    ({"top_p": 0.0}, ValueError),
    ({"top_p": -0.1}, ValueError),
    ({"top_p": 1.01}, ValueError),
    ({"top_p": float("nan")}, ValueError),
    ({"top_p": float("inf")}, ValueError),
    ({"top_p": "0.5"}, TypeError),
    ({"top_p": True}, TypeError),
    ({"min_p": -0.1}, ValueError),
    ({"min_p": 1.0}, ValueError),
    ({"min_p": 1.5}, ValueError),
    ({"min_p": float("nan")}, ValueError),
    ({"min_p": "0.1"}, TypeError),
    ({"seed": -1}, ValueError),
    ({"seed": 1.5}, TypeError),
    ({"seed": "s"}, TypeError),
    ({"seed": np.random.RandomState(0)}, TypeError),
]


@pytest.mark.parametrize(
    "kwargs, error",
    BAD_INIT,
    ids=[f"{next(iter(k))}={_stable_repr(next(iter(k.values())))}" for k, _ in BAD_INIT],
)
def test_bad_decoder_argument(backend, kwargs, error):
    (name,) = kwargs
    with pytest.raises(error, match=name):
        SpeculativeDecoder(backend=backend, **kwargs)


@pytest.mark.parametrize("name", ["c", "CYTHON", "", "numpy", 3])
def test_bad_backend_name(name):
    with pytest.raises(ValueError, match="backend"):
        SpeculativeDecoder(backend=name)
    with pytest.raises(ValueError, match="backend"):
        sample(Model(), [1], 3, backend=name)


def test_good_numpy_scalars_are_accepted(backend):
    draft, target = models()
    decoder = SpeculativeDecoder(
        np.int64(2),
        np.float32(0.5),
        top_k=np.int32(4),
        top_p=np.float64(0.9),
        min_p=np.float32(0.01),
        seed=np.uint8(3),
        backend=backend,
    )
    ids, stats = decoder.generate(
        draft, target, np.array([1, 2], dtype=np.int32), np.int64(4), np.int64(0), rng=np.int16(5)
    )
    assert len(ids) >= 3 and stats.total_tokens_generated == len(ids) - 2
    # constructor values given as the reference's defaults still work positionally
    assert SpeculativeDecoder(4, 1.0, backend=backend).gamma == 4


# --- generate arguments: rejected before any model call -------------------------------------

BAD_GENERATE = [
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, TypeError, "max_new_tokens"),
    ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens"),
    ({"max_new_tokens": "3"}, TypeError, "max_new_tokens"),
    ({"max_new_tokens": None}, TypeError, "max_new_tokens"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens"),
    ({"prompt_ids": []}, ValueError, "prompt_ids"),
    ({"prompt_ids": np.array([], dtype=np.int64)}, ValueError, "prompt_ids"),
    ({"prompt_ids": [-1, 2]}, ValueError, "prompt_ids"),
    ({"prompt_ids": np.array([3, -7])}, ValueError, "prompt_ids"),
    ({"prompt_ids": [1.0, 2.0]}, TypeError, "prompt_ids"),
    ({"prompt_ids": np.array([1.5])}, TypeError, "prompt_ids"),
    ({"prompt_ids": [[1, 2], [3, 4]]}, ValueError, "prompt_ids"),
    ({"prompt_ids": np.zeros((1, 2, 1), dtype=np.int64)}, ValueError, "prompt_ids"),
    ({"prompt_ids": [1, True]}, TypeError, "prompt_ids"),
    ({"prompt_ids": [[2, np.True_]]}, TypeError, "prompt_ids"),
    ({"prompt_ids": np.zeros((2, 2), dtype=np.int64)}, ValueError, "prompt_ids"),
    ({"prompt_ids": np.array(3)}, ValueError, "prompt_ids"),
    ({"prompt_ids": "abc"}, TypeError, "prompt_ids"),
    ({"prompt_ids": b"ab"}, TypeError, "prompt_ids"),
    ({"prompt_ids": [1, None]}, TypeError, "prompt_ids"),
    ({"prompt_ids": [True, False]}, TypeError, "prompt_ids"),
    ({"prompt_ids": [1, [2]]}, TypeError, "prompt_ids"),
    ({"prompt_ids": [5]}, ValueError, "prompt_ids"),  # V = 5: ids in [0, 5)
    ({"prompt_ids": [1, 2**40]}, ValueError, "prompt_ids"),
    ({"eos_token_id": -1}, ValueError, "eos_token_id"),
    ({"eos_token_id": 1.5}, TypeError, "eos_token_id"),
    ({"eos_token_id": "x"}, TypeError, "eos_token_id"),
    ({"eos_token_id": True}, TypeError, "eos_token_id"),
    ({"eos_token_id": 5}, ValueError, "eos_token_id"),
    ({"eos_token_id": np.int64(70)}, ValueError, "eos_token_id"),
    ({"rng": "x"}, TypeError, "rng"),
    ({"rng": 1.5}, TypeError, "rng"),
    ({"rng": True}, TypeError, "rng"),
    ({"rng": [1, 2]}, TypeError, "rng"),
    ({"rng": np.random.RandomState(0)}, TypeError, "rng"),
    ({"rng": np.random.PCG64(0)}, TypeError, "rng"),
    ({"rng": -1}, ValueError, "rng"),
]


@pytest.mark.parametrize(
    "kwargs, error, match",
    BAD_GENERATE,
    ids=[f"{k}={_stable_repr(v)}"[:40] for kw, _, _ in BAD_GENERATE for k, v in kw.items()],
)
def test_bad_generate_argument_before_any_call(backend, kwargs, error, match):
    draft, target = models()
    arguments = {"prompt_ids": [1, 2], "max_new_tokens": 5, "eos_token_id": None}
    arguments.update(kwargs)
    rng = arguments.pop("rng", 0)
    with pytest.raises(error, match=match):
        SpeculativeDecoder(2, backend=backend).generate(draft, target, rng=rng, **arguments)
    assert no_calls(draft, target)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [case for case in BAD_GENERATE if "rng" not in case[0]]
    + [
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 1.5}, TypeError, "top_k"),
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 2.0}, ValueError, "top_p"),
        ({"min_p": 1.0}, ValueError, "min_p"),
        ({"min_p": -0.5}, ValueError, "min_p"),
        ({"seed": -2}, ValueError, "seed"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"rng": "x"}, TypeError, "rng"),
        ({"rng": np.random.RandomState(1)}, TypeError, "rng"),
    ],
)
def test_bad_sample_argument_before_any_call(backend, kwargs, error, match):
    target = Model()
    arguments = {"prompt_ids": [1, 2], "max_new_tokens": 5, "eos_token_id": None}
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        sample(target, backend=backend, **arguments)
    assert target.calls == 0


@pytest.mark.parametrize("bad", [object(), None, 3, "model", np.zeros((1, 2, 5))])
@pytest.mark.parametrize("which", ["draft_model", "target_model"])
def test_model_that_is_neither_forward_nor_callable(backend, bad, which):
    good = Model()
    pair = {"draft_model": good, "target_model": good, which: bad}
    with pytest.raises(TypeError, match=which):
        SpeculativeDecoder(2, backend=backend).generate(
            pair["draft_model"], pair["target_model"], [1], 3, rng=0
        )
    assert good.calls == 0
    if which == "target_model":
        with pytest.raises(TypeError, match="target_model"):
            sample(bad, [1], 3, backend=backend)


def test_prompt_of_shape_1_by_l_is_a_batch_of_one(backend):
    """Tokenizers return (1, L): accepted, with the same result as (L,)."""
    flat = SpeculativeDecoder(2, backend=backend).generate(*models(), [1, 2, 3], 6, rng=4)
    batch = SpeculativeDecoder(2, backend=backend).generate(
        *models(), np.array([[1, 2, 3]]), 6, rng=4
    )
    assert batch[0] == flat[0] and batch[0][:3] == [1, 2, 3]


def _raw_model(module: str, name: str):
    """An instance of a class that claims to live in ``module`` (a stand-in for a
    transformers or llama_cpp class, which these tests need not import)."""
    cls = type(
        name,
        (),
        {
            "__module__": module,
            "forward": lambda self, ids: None,
            "__call__": lambda self, ids: None,
        },
    )
    return cls()


@pytest.mark.parametrize(
    "module, name, adapter",
    [
        ("transformers.models.gpt2.modeling_gpt2", "GPT2LMHeadModel", "TransformersModel"),
        ("llama_cpp.llama", "Llama", "LlamaCppModel"),
    ],
)
@pytest.mark.parametrize("which", ["draft_model", "target_model"])
def test_raw_real_model_names_its_adapter(backend, module, name, adapter, which):
    good = Model()
    pair = {"draft_model": good, "target_model": good, which: _raw_model(module, name)}
    with pytest.raises(TypeError, match=f"{which}.*specdec.models.{adapter}"):
        SpeculativeDecoder(2, backend=backend).generate(
            pair["draft_model"], pair["target_model"], [1], 3, rng=0
        )
    assert good.calls == 0


@pytest.mark.parametrize("which", ["draft_model", "target_model"])
def test_model_class_instead_of_instance(backend, which):
    good = Model()
    pair = {"draft_model": good, "target_model": good, which: Model}
    with pytest.raises(TypeError, match=f"{which} is the class Model.*instance"):
        SpeculativeDecoder(2, backend=backend).generate(
            pair["draft_model"], pair["target_model"], [1], 3, rng=0
        )
    with pytest.raises(TypeError, match="target_model is the class"):
        sample(Model, [1], 3, backend=backend)


def test_non_callable_forward_attribute(backend):
    class Broken:
        forward = 3

    with pytest.raises(TypeError, match="draft_model"):
        SpeculativeDecoder(backend=backend).generate(Broken(), Model(), [1], 3)


def test_declared_vocab_sizes_differ_before_any_call(backend):
    draft, target = Model(5, seed=1), Model(6, seed=2)
    with pytest.raises(ValueError, match=r"draft_model.*target_model") as info:
        SpeculativeDecoder(2, backend=backend).generate(draft, target, [1], 5, rng=0)
    assert "5" in str(info.value) and "6" in str(info.value)
    assert no_calls(draft, target)


@pytest.mark.parametrize("sizes", [(5, 6), (6, 5), (2, 128)])
def test_undeclared_vocab_sizes_differ_on_the_first_target_call(backend, sizes):
    draft = Model(sizes[0], seed=1, declare=False)
    target = Model(sizes[1], seed=2, declare=False)
    with pytest.raises(ValueError, match=r"vocabulary") as info:
        SpeculativeDecoder(3, backend=backend).generate(draft, target, [1], 5, rng=0)
    message = str(info.value)
    assert str(sizes[0]) in message and str(sizes[1]) in message
    assert target.calls == 1


@pytest.mark.parametrize("which", ["draft", "target"])
def test_declared_vocab_size_that_the_logits_contradict(backend, which):
    honest, lying = Model(7, seed=1), Model(5, seed=2)
    lying.vocab_size = 7  # declares 7, returns 5 logits per row
    draft, target = (lying, honest) if which == "draft" else (honest, lying)
    with pytest.raises(ValueError, match=rf"{which}_model.*\b5\b.*\b7\b"):
        SpeculativeDecoder(2, backend=backend).generate(draft, target, [1], 5, rng=0)
    assert lying.calls == 1


def test_token_ids_beyond_an_unknown_vocabulary_after_the_first_call(backend):
    draft, target = models(declare=False)
    with pytest.raises(ValueError, match="prompt_ids"):
        SpeculativeDecoder(2, backend=backend).generate(draft, target, [1, 9], 5, rng=0)
    assert draft.calls == 1 and target.calls == 0
    with pytest.raises(ValueError, match="eos_token_id"):
        SpeculativeDecoder(2, backend=backend).generate(*models(declare=False), [1], 5, 5, rng=0)
    target = Model(declare=False)
    with pytest.raises(ValueError, match="prompt_ids"):
        sample(target, [5], 3, backend=backend)
    assert target.calls == 1


# --- bad model output ----------------------------------------------------------------------

BAD_OUTPUT = {
    "rank2": (lambda out, ids: out[0], ValueError),
    "rank4": (lambda out, ids: out[np.newaxis], ValueError),
    "fewer_rows": (lambda out, ids: out[:, 1:], ValueError),
    "more_rows": (lambda out, ids: np.concatenate([out, out[:, :1]], axis=1), ValueError),
    "batch2": (lambda out, ids: np.concatenate([out, out], axis=0), ValueError),
    "batch0": (lambda out, ids: out[:0], ValueError),
    "empty_vocab": (lambda out, ids: out[:, :, :0], ValueError),
    "int64": (lambda out, ids: np.round(out).astype(np.int64), TypeError),
    "int8": (lambda out, ids: np.round(out).astype(np.int8), TypeError),
    "float16": (lambda out, ids: out.astype(np.float16), TypeError),
    "bool": (lambda out, ids: out > 0, TypeError),
    "complex": (lambda out, ids: out.astype(np.complex128), TypeError),
    "object": (lambda out, ids: out.astype(object), TypeError),
    "none": (lambda out, ids: None, ValueError),
}


@pytest.mark.parametrize("kind", list(BAD_OUTPUT))
@pytest.mark.parametrize("which", ["draft", "target"])
def test_bad_logits_named_on_the_first_call(backend, which, kind):
    edit, error = BAD_OUTPUT[kind]
    declare = kind != "empty_vocab"
    draft, target = Model(seed=1, declare=declare), Model(seed=2, declare=declare)
    (draft if which == "draft" else target).edit = edit
    with pytest.raises(error, match=f"{which}_model"):
        SpeculativeDecoder(3, backend=backend).generate(draft, target, [1, 2], 6, rng=0)
    assert (draft if which == "draft" else target).calls == 1
    if which == "target":
        target.calls = 0
        with pytest.raises(error, match="target_model"):
            sample(target, [1, 2], 4, backend=backend)
        assert target.calls == 1


def put(position, value, vocab_ids=(0,)):
    """An edit that writes ``value`` into the row of sequence ``position``."""

    def edit(out, ids):
        out = np.array(out)
        if len(ids) > position:
            out[0, position, list(vocab_ids)] = value
        return out

    return edit


def mask_row(position):
    def edit(out, ids):
        out = np.array(out)
        if len(ids) > position:
            out[0, position, :] = -np.inf
        return out

    return edit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("which", ["draft", "target"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("position", [2, 4])
def test_nonfinite_logits_name_the_model_and_position(
    backend, dtype, temperature, which, value, position
):
    # identical draft and target: every draft before the bad row is kept, so the
    # target's verification reaches the bad row in its first pass
    draft, target = Model(seed=3, dtype=dtype), Model(seed=3, dtype=dtype)
    (draft if which == "draft" else target).edit = put(position, value, vocab_ids=(1, 3))
    with pytest.raises(ValueError, match=rf"{which}_model.*NaN or \+inf.*position {position}\b"):
        SpeculativeDecoder(4, temperature, backend=backend).generate(
            draft, target, [0, 1, 2], 8, rng=0
        )
    if which == "target":
        assert target.calls == 1
        target.calls = 0
        with pytest.raises(ValueError, match=rf"target_model.*position {position}\b"):
            sample(target, [0, 1, 2], 8, temperature=temperature, backend=backend)
        assert target.calls == 3 - (position == 2) * 2  # rows 2, 3, 4 are sampled in turn


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("which", ["draft", "target"])
def test_a_row_of_only_minus_inf_is_an_error(backend, temperature, which):
    draft, target = Model(seed=3), Model(seed=3)
    (draft if which == "draft" else target).edit = mask_row(3)
    with pytest.raises(ValueError, match=rf"{which}_model.*all -inf.*position 3\b"):
        SpeculativeDecoder(4, temperature, backend=backend).generate(
            draft, target, [0, 1, 2], 8, rng=0
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_minus_inf_is_a_mask(backend, dtype, temperature):
    draft = ContextModel(6, seed=5, dtype=dtype, masked=[0, 4])
    target = ContextModel(6, seed=6, dtype=dtype, masked=[1, 4])
    seen = set()
    for seed in range(20):
        ids, _ = SpeculativeDecoder(3, temperature, top_k=3, backend=backend).generate(
            draft, target, [2, 3], 12, rng=seed
        )
        seen.update(ids[2:])
    assert 1 not in seen and 4 not in seen
    assert 0 in seen or temperature == 0.0  # draft-masked tokens come from the residual


# --- ids beyond int64, a vocabulary declared by one model, tiny temperatures ---------------


def test_uint64_prompt_beyond_int64(backend):
    draft, target = models()
    with pytest.raises(ValueError, match="prompt_ids"):
        SpeculativeDecoder(2, backend=backend).generate(
            draft, target, np.array([2**64 - 1], dtype=np.uint64), 3, rng=0
        )
    assert no_calls(draft, target)


def test_python_int_prompt_beyond_int64(backend):
    draft, target = models()
    with pytest.raises(ValueError, match="prompt_ids"):
        SpeculativeDecoder(2, backend=backend).generate(draft, target, [1, 2**70], 3, rng=0)


def test_vocab_declared_by_the_target_only(backend):
    draft, target = Model(seed=1, declare=False), Model(seed=2)
    with pytest.raises(ValueError, match="prompt_ids"):
        SpeculativeDecoder(2, backend=backend).generate(draft, target, [1, 7], 3, rng=0)
    assert no_calls(draft, target)


@pytest.mark.parametrize("entry", ["sample", "generate"])
def test_float32_logits_with_a_tiny_temperature(backend, entry):
    target = ContextModel(5, seed=2, dtype=np.float32)
    greedy = sample(target, [1], 5, temperature=0.0, backend=backend)[0]
    try:
        if entry == "sample":
            ids = sample(target, [1], 5, temperature=1e-39, seed=0, backend=backend)[0]
        else:
            ids = SpeculativeDecoder(2, 1e-39, backend=backend).generate(
                ContextModel(5, seed=3, dtype=np.float32), target, [1], 5, rng=0
            )[0]
    except ValueError as error:  # refusing the temperature up front is fine too
        assert "temperature" in str(error)
    else:
        assert ids == greedy
