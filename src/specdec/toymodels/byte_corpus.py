"""The demo's n-gram models: byte-level text, the stdlib corpus, and the model cache.

This module trains a draft and a target :class:`~specdec.toymodels.byte_kn.ByteKneserNey`
from the Python standard library's own source code: a byte-level
(``V = 256``) model of low order as the draft and one of higher order as the
target.

Trained models are cached as ``.npz`` files (no pickle) under
``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec``, else
``~/.cache/specdec``, keyed by a fingerprint of the training corpus and the
model order, so only the first run pays for training.

Examples
--------
>>> from specdec.toymodels import byte_corpus
>>> draft, target = byte_corpus.load_default_models()          # doctest: +SKIP
>>> ids = byte_corpus.encode("def main(")
>>> target.forward([ids], logits_to_keep=1).shape              # doctest: +SKIP
(1, 1, 256)
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

from specdec.toymodels.byte_kn import VOCAB_SIZE, ByteKneserNey, _as_tokens, _fingerprint

__all__ = [
    "VOCAB_SIZE",
    "DEFAULT_DRAFT_ORDER",
    "DEFAULT_TARGET_ORDER",
    "DEFAULT_CORPUS_BYTES",
    "encode",
    "decode",
    "stdlib_sources",
    "training_corpus",
    "heldout_corpus",
    "cache_dir",
    "load_or_train",
    "load_default_models",
]

#: Order of the default draft model (a context of three bytes).  In ``specdec
#: demo`` runs (gamma 4, temperature 0.8 to 1) a 4-gram draft keeps about 0.55
#: of its drafts against the 6-gram target, a trigram only about 0.35, for
#: about the same cost per call (~0.1 ms).
DEFAULT_DRAFT_ORDER = 4
#: Order of the default target model (a context of five bytes).
DEFAULT_TARGET_ORDER = 6
#: Size of the default training corpus: about 4 MB trains both default models
#: in about a second while still giving a 6-gram model plenty of data.
DEFAULT_CORPUS_BYTES = 4_000_000

# Parts of the standard library that are not representative Python source:
# test suites (huge, repetitive), generated tables (encodings, pydoc topics),
# demos, and whatever third-party code happens to be installed.
_EXCLUDED_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "turtledemo",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "encodings",
        "pydoc_data",
        "ensurepip",
        "__pycache__",
    }
)


# ---------------------------------------------------------------------------
# Text <-> ids


def encode(text: str) -> list[int]:
    """Encode text as byte-level token ids.

    Parameters
    ----------
    text : str
        Any Unicode text; it is encoded as UTF-8.

    Returns
    -------
    list of int
        One id in ``range(256)`` per UTF-8 byte.
    """
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Decode byte-level token ids back to text.

    Parameters
    ----------
    ids : iterable of int
        Ids in ``range(256)``.

    Returns
    -------
    str
        The UTF-8 decoding; byte sequences that are not valid UTF-8 (a sampler
        can produce them) become U+FFFD instead of raising.
    """
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------
# Training corpus


def stdlib_sources(stdlib: str | os.PathLike | None = None) -> list[Path]:
    """List the standard library's ``.py`` files in a deterministic order.

    Parameters
    ----------
    stdlib : path-like, optional
        Root of the standard library; defaults to
        ``sysconfig.get_paths()["stdlib"]``.

    Returns
    -------
    list of pathlib.Path
        Source files outside test suites and generated tables, ordered by a
        hash of their relative path.  Hashing rather than sorting by name
        spreads any prefix of the list over the whole library (a name-sorted
        prefix would be all ``asyncio`` and ``collections``), and it does not
        depend on the file system's listing order.
    """
    root = Path(stdlib if stdlib is not None else sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place stops os.walk from descending at all.
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                rel = path.relative_to(root).as_posix()
                found.append((hashlib.sha1(rel.encode()).hexdigest(), path))
    found.sort()
    return [path for _, path in found]


def _read_corpus(paths, skip_bytes: int, max_bytes: int) -> bytes:
    """Concatenate whole files, skipping the first *skip_bytes* worth of files."""
    chunks, seen, size = [], 0, 0
    for path in paths:
        data = path.read_bytes()
        if seen < skip_bytes:
            seen += len(data)
            continue
        if size and size + len(data) > max_bytes:
            break
        chunks.append(data)
        size += len(data)
    return b"\n".join(chunks)


def training_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES, stdlib=None) -> bytes:
    """Return the default training text: whole stdlib files up to *max_bytes*.

    Parameters
    ----------
    max_bytes : int, optional
        Stop adding files once the next one would exceed this size.
    stdlib : path-like, optional
        Root of the standard library (see :func:`stdlib_sources`).

    Returns
    -------
    bytes
        The files' contents joined by newlines.
    """
    return _read_corpus(stdlib_sources(stdlib), 0, max_bytes)


def heldout_corpus(
    max_bytes: int = 200_000, train_bytes: int = DEFAULT_CORPUS_BYTES, stdlib=None
) -> bytes:
    """Return stdlib text that :func:`training_corpus` does not contain.

    Parameters
    ----------
    max_bytes : int, optional
        Approximate size of the returned text.
    train_bytes : int, optional
        The *max_bytes* the training corpus was built with; files up to and
        including the one that crosses it are skipped.
    stdlib : path-like, optional
        Root of the standard library.

    Returns
    -------
    bytes
        Whole files from later in the :func:`stdlib_sources` order.
    """
    # The training corpus stops *before* the file that would cross its budget,
    # while this skips *through* it, so one file may be in neither: harmless.
    return _read_corpus(stdlib_sources(stdlib), train_bytes, max_bytes)


# ---------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    """Directory holding cached models.

    Returns
    -------
    pathlib.Path
        ``$SPECDEC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/specdec``, else
        ``~/.cache/specdec``.  It is not created here.
    """
    explicit = os.environ.get("SPECDEC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "specdec"


def load_or_train(corpus, order: int, vocab_size: int = VOCAB_SIZE, directory=None, on_train=None):
    """Return the model of *order* trained on *corpus*, from the cache if possible.

    Parameters
    ----------
    corpus : bytes or array_like of int
        Training text.
    order : int
        Model order.
    vocab_size : int, optional
        Vocabulary size.
    directory : path-like, optional
        Cache directory; defaults to :func:`cache_dir`.
    on_train : callable, optional
        Called with no argument just before training starts, e.g. to tell a
        user why the first run is slower.

    Returns
    -------
    model : ByteKneserNey
    cached : bool
        Whether the model came from the cache.

    Notes
    -----
    A cache file that cannot be read (truncated, from another version) is
    retrained and overwritten; a cache directory that cannot be written only
    costs the next run a retraining, so that error is ignored.
    """
    tokens = _as_tokens(corpus, vocab_size)
    fp = _fingerprint(tokens, order, vocab_size)
    path = (
        Path(directory if directory is not None else cache_dir())
        / f"ngram-v{vocab_size}-o{order}-{fp}.npz"
    )
    if path.exists():
        try:
            model = ByteKneserNey.load(path)
            if model.fingerprint == fp:
                return model, True
        except (OSError, ValueError, KeyError):
            pass
    if on_train is not None:
        on_train()
    model = ByteKneserNey.train(tokens, order, vocab_size)
    try:
        model.save(path)
    except OSError:
        pass
    return model, False


def load_default_models(
    draft_order: int = DEFAULT_DRAFT_ORDER,
    target_order: int = DEFAULT_TARGET_ORDER,
    *,
    max_bytes: int = DEFAULT_CORPUS_BYTES,
    directory=None,
    return_info: bool = False,
    on_train=None,
):
    """The default byte-level draft and target models, trained on the stdlib.

    Parameters
    ----------
    draft_order, target_order : int, optional
        Orders of the two models.
    max_bytes : int, optional
        Size of the training corpus (see :func:`training_corpus`).
    directory : path-like, optional
        Cache directory; defaults to :func:`cache_dir`.
    return_info : bool, optional
        Also return a dict with ``corpus_bytes`` and ``cached`` (True only if
        both models came from the cache).
    on_train : callable, optional
        Passed to :func:`load_or_train`: called before each model is trained.

    Returns
    -------
    draft, target : ByteKneserNey
    info : dict
        Only if *return_info*.
    """
    corpus = training_corpus(max_bytes)
    draft, draft_cached = load_or_train(corpus, draft_order, directory=directory, on_train=on_train)
    target, target_cached = load_or_train(
        corpus, target_order, directory=directory, on_train=on_train
    )
    if return_info:
        info = {"corpus_bytes": len(corpus), "cached": draft_cached and target_cached}
        return draft, target, info
    return draft, target
