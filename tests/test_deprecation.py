"""Renamed names (0.3) still work until 0.4, with a warning; defaults are one per concept.

Every old name gives the same result as its new name and warns (a
``DeprecationWarning`` in the library, a note on stderr in the command line); giving
both names is an error.  ``gamma=None`` is the library's and the command line's one
default: the drafters' own ``num_tokens``, else the reference's 4.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec import cli
from specdec.batch import ModelSpec
from specdec.batch.models import ToyModels
from specdec.drafters import Chain, NGram, PositionalDraftLength, PromptLookup, SuffixDrafter


def test_suffix_drafter_min_token_prob_is_min_probability():
    with pytest.warns(DeprecationWarning, match="min_token_prob= is deprecated.*min_probability"):
        old = SuffixDrafter(min_token_prob=0.3)
    assert old.min_probability == 0.3 == SuffixDrafter(min_probability=0.3).min_probability
    with pytest.warns(DeprecationWarning, match="min_token_prob"):
        assert old.min_token_prob == 0.3
    with pytest.raises(TypeError, match="both min_probability= and its old name"):
        SuffixDrafter(min_probability=0.2, min_token_prob=0.3)
    # one name with NGram's floor on the proposal's estimated probability
    assert NGram(min_probability=0.3).min_probability == 0.3


def test_verify_tree_token_ids_is_draft_token_ids():
    target = np.random.default_rng(0).standard_normal((4, 10))
    new = specdec.verify_tree([3, 5, 1], [-1, -1, 0], target, rng=1)
    with pytest.warns(DeprecationWarning, match="token_ids= is deprecated.*draft_token_ids"):
        old = specdec.verify_tree(
            token_ids=[3, 5, 1], parents=[-1, -1, 0], target_logits=target, rng=1
        )
    assert old[0].tolist() == new[0].tolist() and old[1] == new[1]
    with pytest.raises(TypeError, match="both draft_token_ids= and its old name"):
        specdec.verify_tree(
            draft_token_ids=[3], token_ids=[3], parents=[-1], target_logits=target[:2]
        )
    # errors name the argument as verify() does (no rewritten messages)
    with pytest.raises(ValueError, match=r"draft_token_ids\[1\] is 10, outside"):
        specdec.verify_tree([3, 10, 1], [-1, -1, 0], target, rng=1)


def test_a_cost_pair_is_refused_with_a_hint():
    with pytest.raises(ValueError, match=r"target_cost\[0\] must be 1.0.*pair is no longer"):
        PositionalDraftLength(target_cost=(0.57, 0.33))


def test_gamma_none_is_the_draft_sources_own():
    decoder = specdec.SpeculativeDecoder()
    assert decoder.gamma is None and "gamma=None" in repr(decoder)
    draft = ContextModel(6, seed=1)
    assert decoder.max_draft_tokens(PromptLookup(num_tokens=7)) == 7
    assert decoder.max_draft_tokens(SuffixDrafter()) == 16
    assert decoder.max_draft_tokens(draft) == 4  # the reference loop's default
    assert decoder.max_draft_tokens(Chain(PromptLookup(num_tokens=3), draft)) == 4
    assert decoder.max_draft_tokens(Chain(PromptLookup(num_tokens=9), draft)) == 9
    decoder.gamma = 5
    assert decoder.max_draft_tokens(PromptLookup()) == 5 == decoder.max_draft_tokens(draft)
    decoder.gamma = None
    assert decoder.gamma is None
    with pytest.raises(TypeError, match="gamma must be an int"):
        decoder.gamma = 2.5


def _run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_old_names_work_with_a_note(capsys):
    new = ["generate", "--model", "toy", "--draft", "ngram-model", "--max-new-tokens", "12"]
    old = ["generate", "--model", "ngram", "--draft", "ngram", "--max-tokens", "12"]
    common = ["--prompt", "def f(", "--json", "--seed", "3"]
    code, out_new, err_new = _run_cli([*new, *common], capsys)
    assert code == 0 and "note:" not in err_new
    code, out_old, err_old = _run_cli([*old, *common], capsys)
    assert code == 0
    assert "note: --model ngram is now --model toy" in err_old
    assert "note: --draft ngram is now --draft ngram-model" in err_old
    assert '"max_new_tokens": 12' in out_old
    strip = lambda text: text.split('"seconds"')[0]  # noqa: E731 - timings differ
    assert strip(out_old) == strip(out_new)


def test_batch_model_spec_old_names_warn():
    with pytest.warns(DeprecationWarning) as record:  # both old names: two warnings
        spec = ModelSpec("ngram", "ngram")
    messages = [str(w.message) for w in record]
    assert any(re.search("'ngram' is deprecated.*'toy'", m) for m in messages), messages
    assert any("'ngram-model'" in m for m in messages), messages
    assert (spec.model, spec.draft) == ("toy", "ngram-model")
    with pytest.warns(DeprecationWarning, match="'ngram-model'"):
        assert ToyModels(draft="ngram").draft == "ngram-model"
