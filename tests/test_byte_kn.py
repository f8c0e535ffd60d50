"""Tests of the demo's Kneser-Ney byte models (specdec.toymodels.byte_kn, byte_corpus)."""

import re
from collections import Counter

import numpy as np
import pytest

from specdec.toymodels import byte_corpus as ngram
from specdec.toymodels.byte_kn import ByteKneserNey, _discounts

# Small enough to train in well under a second, large enough for a 5-gram to
# beat a trigram on held-out text.
TRAIN_BYTES = 400_000


@pytest.fixture(scope="module")
def corpus():
    return ngram.training_corpus(TRAIN_BYTES)


@pytest.fixture(scope="module")
def heldout():
    return ngram.heldout_corpus(30_000, train_bytes=TRAIN_BYTES)


@pytest.fixture(scope="module")
def models(corpus):
    return {order: ByteKneserNey.train(corpus, order) for order in (1, 3, 5)}


def _ids(text: str) -> np.ndarray:
    return np.array([ngram.encode(text)], dtype=np.int64)


# -- the corpus ---------------------------------------------------------------


def test_corpus_is_deterministic_and_disjoint_from_heldout(corpus, heldout):
    assert 0.8 * TRAIN_BYTES < len(corpus) <= TRAIN_BYTES + 200
    assert ngram.training_corpus(TRAIN_BYTES) == corpus
    assert len(heldout) > 10_000
    # Whole files are in one corpus or the other: the start of the held-out
    # text (spanning a file or more) does not occur in the training text.
    assert heldout[:2000] not in corpus


def test_stdlib_sources_skip_tests_and_generated_tables():
    paths = ngram.stdlib_sources()
    assert len(paths) > 100
    parts = {part for path in paths for part in path.parts}
    assert not parts & {"test", "tests", "site-packages", "encodings"}
    assert paths == ngram.stdlib_sources()


def test_encode_decode_round_trip():
    text = "naïve café → ok\n"
    assert ngram.decode(ngram.encode(text)) == text
    assert all(0 <= i < 256 for i in ngram.encode(text))
    # A sampler can produce invalid UTF-8; decoding must not raise.
    assert ngram.decode([0xFF, 0x41]) == "\ufffdA"


# -- probabilities -------------------------------------------------------------


@pytest.mark.parametrize("order", [1, 3, 5])
def test_rows_are_distributions_with_no_zero(models, order):
    # Raw 0xFF and 0x00 bytes never occur in Python source.
    ids = np.array([list(b"import os\nclass Foo(object):\n\tdef \xff\x00")])
    logits = models[order].forward(ids)
    assert logits.dtype == np.float32 and logits.shape == (1, ids.shape[1], 256)
    p = np.exp(logits.astype(np.float64))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)
    assert np.isfinite(logits).all()
    # Bytes never seen in training, and contexts never seen, still leave
    # every byte some probability.
    assert (p > 0).all()


def test_higher_order_has_lower_heldout_perplexity(models, heldout):
    ppl = {order: model.perplexity(heldout) for order, model in models.items()}
    assert ppl[5] < ppl[3] < ppl[1]
    # Bits per byte of Python source: a 5-gram should be well under 3.
    assert np.log2(ppl[5]) < 3.0


def test_logits_to_keep_returns_the_last_rows(models):
    model = models[5]
    ids = _ids("def f(x):\n    return x + 1\n")
    full = model.forward(ids)
    for n in (0, 1, 4, ids.shape[1]):
        part = model.forward(ids, logits_to_keep=n)
        assert part.shape == (1, n, 256)
        np.testing.assert_array_equal(part[0], full[0, ids.shape[1] - n :])


def test_forward_accepts_readonly_int64_and_rejects_bad_input(models):
    ids = _ids("abc")
    ids.flags.writeable = False
    assert models[3].forward(ids, logits_to_keep=1).shape == (1, 1, 256)
    with pytest.raises(ValueError, match="shape"):
        models[3].forward(np.arange(3))
    with pytest.raises(ValueError, match="logits_to_keep"):
        models[3].forward(ids, logits_to_keep=4)
    with pytest.raises(ValueError, match="token ids"):
        models[3].forward(np.array([[1, 256]]))


def _two_bytes_before(corpus: bytes, suffix: bytes) -> tuple[int, int]:
    """The two bytes that most often precede *suffix* in the corpus."""
    found = re.finditer(re.escape(suffix), corpus)
    before = Counter(corpus[m.start() - 1] for m in found if m.start() > 0)
    (a, _), (b, _) = before.most_common(2)
    return a, b


@pytest.mark.parametrize("order", [3, 5])
def test_context_is_order_minus_one_tokens(models, corpus, order):
    # An n-gram model sees the last n - 1 bytes: changing the byte just before
    # them must not change its prediction, changing the oldest of them must.
    # Both edits sit right at the boundary, and every context involved occurs
    # in the training text (so no back-off hides a difference): a model that
    # saw one byte more or one byte fewer fails.
    model, seen = models[order], order - 1
    suffix = b"self._name"[-seen:]
    a, b = _two_bytes_before(corpus, suffix)
    c, d = _two_bytes_before(corpus, suffix[1:])

    def last_row(data: bytes):
        return model.forward(np.array([list(b"x = " + data)]), logits_to_keep=1)

    np.testing.assert_array_equal(last_row(bytes([a]) + suffix), last_row(bytes([b]) + suffix))
    oldest_seen = [bytes([x]) + suffix[1:] for x in (c, d)]
    assert not np.array_equal(last_row(oldest_seen[0]), last_row(oldest_seen[1]))


# -- agreement with a direct implementation -----------------------------------


def _naive_kneser_ney(tokens, order, vocab_size):
    """Interpolated modified Kneser-Ney with dicts, one probability at a time."""
    grams = {
        k: Counter(tuple(tokens[i : i + k]) for i in range(len(tokens) - k + 1))
        for k in range(1, order + 1)
    }
    tables = {}
    for k in range(1, order + 1):
        counts = grams[k] if k == order else Counter(g[1:] for g in grams[k + 1])
        discounts = _discounts(np.array(list(counts.values())))
        by_context = {}
        for gram, c in counts.items():
            by_context.setdefault(gram[:-1], {})[gram[-1]] = c
        tables[k] = (by_context, discounts)

    def prob(history, w):
        p = 1.0 / vocab_size
        for k in range(1, order + 1):
            if k - 1 > len(history):
                break
            context = tuple(history[len(history) - (k - 1) :]) if k > 1 else ()
            by_context, discounts = tables[k]
            row = by_context.get(context)
            if row is None:
                continue
            total = sum(row.values())
            d = {c: discounts[min(c, 3) - 1] for c in set(row.values())}
            gamma = sum(d[c] for c in row.values()) / total
            c_w = row.get(w, 0)
            p = (c_w - d[c_w]) / total + gamma * p if c_w else gamma * p
        return p

    return prob


def test_matches_a_direct_kneser_ney_implementation():
    rng = np.random.default_rng(0)
    # A small alphabet with structure (a random walk), so every order has
    # repeated contexts and every count class occurs.
    tokens = list(np.cumsum(rng.integers(-1, 2, size=3000)) % 7)
    order, vocab_size = 4, 9
    model = ByteKneserNey.train(tokens, order, vocab_size=vocab_size)
    naive = _naive_kneser_ney(tokens, order, vocab_size)
    sequence = [int(t) for t in tokens[:40]] + [8, 8, 3]  # 8 never occurs in training
    probs = model.probabilities(sequence, np.arange(len(sequence)))
    expected = np.array(
        [[naive(sequence[: i + 1], w) for w in range(vocab_size)] for i in range(len(sequence))]
    )
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_discounts_follow_chen_goodman():
    counts = np.array([1] * 50 + [2] * 20 + [3] * 10 + [4] * 5 + [9] * 3)
    y = 50 / (50 + 2 * 20)
    expected = [1 - 2 * y * 20 / 50, 2 - 3 * y * 10 / 20, 3 - 4 * y * 5 / 10]
    np.testing.assert_allclose(_discounts(counts), expected)
    # Degenerate tables (no count 2) still get positive discounts.
    assert (_discounts(np.array([1, 1, 5])) > 0).all()


def test_token_level_model_with_a_large_vocabulary():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 50_000, size=5000)
    model = ByteKneserNey.train(tokens, 3, vocab_size=50_000)
    logits = model.forward(tokens[None, :10], logits_to_keep=2)
    assert logits.shape == (1, 2, 50_000)
    np.testing.assert_allclose(np.exp(logits.astype(np.float64)).sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="64-bit"):
        ByteKneserNey.train(tokens, 5, vocab_size=50_000)


# -- the cache -------------------------------------------------------------------


def test_cache_round_trips_to_identical_logits(corpus, tmp_path):
    ids = _ids("for key, value in sorted(items.items()):\n")
    model, cached = ngram.load_or_train(corpus, 4, directory=tmp_path)
    assert not cached
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and model.fingerprint in files[0].name
    again, cached = ngram.load_or_train(corpus, 4, directory=tmp_path)
    assert cached and again.order == 4 and again.fingerprint == model.fingerprint
    np.testing.assert_array_equal(again.forward(ids), model.forward(ids))
    # A different corpus or order is a different file, not a stale hit.
    _, cached = ngram.load_or_train(corpus[:-1000], 4, directory=tmp_path)
    assert not cached
    _, cached = ngram.load_or_train(corpus, 3, directory=tmp_path)
    assert not cached
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_cache_file_has_no_pickles(corpus, tmp_path):
    ngram.load_or_train(corpus[:20_000], 3, directory=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    with np.load(path, allow_pickle=False) as z:
        assert all(z[name].dtype != object for name in z.files)


def test_corrupt_cache_file_is_retrained(corpus, tmp_path):
    model, _ = ngram.load_or_train(corpus[:20_000], 3, directory=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(b"not a zip file")
    again, cached = ngram.load_or_train(corpus[:20_000], 3, directory=tmp_path)
    assert not cached
    ids = _ids("abc")
    np.testing.assert_array_equal(again.forward(ids), model.forward(ids))
    assert ByteKneserNey.load(path).fingerprint == model.fingerprint


def test_cache_dir_honours_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "a"))
    assert ngram.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SPECDEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ngram.cache_dir() == tmp_path / "xdg" / "specdec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ngram.cache_dir() == tmp_path / "home" / ".cache" / "specdec"


def test_default_models_load_from_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    calls = []
    draft, target, info = ngram.load_default_models(
        2, 3, max_bytes=50_000, return_info=True, on_train=lambda: calls.append(1)
    )
    assert (draft.order, target.order) == (2, 3) and not info["cached"] and len(calls) == 2
    _, _, info = ngram.load_default_models(
        2, 3, max_bytes=50_000, return_info=True, on_train=lambda: calls.append(1)
    )
    assert info["cached"] and len(calls) == 2


# -- with the decoder -------------------------------------------------------------


def test_models_drive_the_decoder(models, backend):
    import specdec

    prompt = ngram.encode("def __init__(self")
    decoder = specdec.SpeculativeDecoder(gamma=3, temperature=0.8, seed=0, backend=backend)
    ids, stats = decoder.generate(models[3], models[5], prompt, max_new_tokens=40)
    assert ids[: len(prompt)] == prompt and len(ids) == len(prompt) + 40
    assert stats.total_tokens_generated == 40
    # Real models that agree often: a useful share of drafts is kept, as often as the
    # models agree (test_drafts_are_kept_as_often_as_the_models_agree).
    assert 0.1 < stats.acceptance_rate < 0.95
    assert isinstance(ngram.decode(ids), str)


def _laws(model, seq, first, temperature):
    logits = model.forward(np.array([seq], dtype=np.int64))[0, first:] / temperature
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def _kept_minus_expected(passes, overlap, gamma) -> float:
    """(kept - sum of the tested positions' overlaps) / its standard deviation.

    A pass of m <= gamma tokens kept m - 1 drafts and rejected its last position's; a
    pass of gamma + 1 kept gamma, its last token the bonus (no test).
    """
    kept, expected, variance, start = 0, 0.0, 0.0, 0
    for tokens in passes:
        m = len(tokens)
        tested = overlap[start : start + min(m, gamma)]
        kept += min(m - 1, gamma)
        expected += float(tested.sum())
        variance += float((tested * (1.0 - tested)).sum())
        start += m
    return (kept - expected) / variance**0.5


def test_drafts_are_kept_as_often_as_the_models_agree(models, backend):
    """With token verification a tested draft token is kept with chance sum_x min(p(x),
    q(x)), the two laws' overlap at its context, which is the output's prefix (the
    drafts before it were kept).  Summed over the tests of a long run, kept minus the
    overlaps is a martingale (whether a position is tested is known before its test):
    mean 0, variance the sum of o(1 - o).  A sampler that keeps every draft is far off
    (shown below)."""
    import specdec

    prompt = ngram.encode("def __init__(self")
    decoder = specdec.SpeculativeDecoder(
        gamma=3, temperature=0.8, seed=0, verification="token", backend=backend
    )
    passes = [p.copy() for p in decoder.stream(models[3], models[5], prompt, 400)]
    ids = prompt + [int(t) for p in passes for t in p]
    p = _laws(models[5], ids[:-1], len(prompt) - 1, 0.8)
    q = _laws(models[3], ids[:-1], len(prompt) - 1, 0.8)
    overlap = np.minimum(p, q).sum(axis=1)  # at each new position
    assert 0.2 < overlap.mean() < 0.9  # neither a trivial pair nor a copy
    assert abs(_kept_minus_expected(passes, overlap, gamma=3)) < 4
    # The same statistic rejects a sampler that keeps every draft (3 kept per pass).
    keep_all = [np.zeros(4, np.int64)] * (len(overlap) // 4)
    assert _kept_minus_expected(keep_all, overlap, gamma=3) > 8
