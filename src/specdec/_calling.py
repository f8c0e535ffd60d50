"""Calling a model: the protocol, its checks, and the time spent in it."""

from __future__ import annotations

import inspect
import time
import weakref

import numpy as np

_LOGIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# Answers of accepts_logits_to_keep by function: a decoder checks its models on every
# call, and inspect.signature costs more than a short generation's kernels.  Weak keys,
# so that closures and models made per request do not accumulate.
_KEEPS_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def accepts_logits_to_keep(fn) -> bool:
    """True when `fn` takes a `logits_to_keep` argument (shared with the demo models)."""
    # A bound method answers as its function does: binding only removes `self`.
    key = getattr(fn, "__func__", fn)
    try:
        return _KEEPS_ROWS[key]
    except (KeyError, TypeError):  # not seen yet, or not weakly referenceable / hashable
        pass
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        answer = False
    else:
        parameter = parameters.get("logits_to_keep")
        answer = parameter is not None and parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
    try:
        _KEEPS_ROWS[key] = answer
    except TypeError:
        pass
    return answer


def _adapter_for(model) -> str | None:
    """The specdec adapter a known raw model needs, or None.

    A ``transformers`` model returns a ``ModelOutput`` of torch tensors, and a
    ``llama_cpp.Llama`` has no ``forward``: both need an adapter that keeps their
    cache and returns NumPy logits.
    """
    modules = [getattr(cls, "__module__", "") or "" for cls in type(model).__mro__]
    if any(module.split(".")[0] == "llama_cpp" for module in modules):
        return "LlamaCppModel"
    if any(module.split(".")[0] == "transformers" for module in modules):
        return "TransformersModel"
    return None


class ModelCaller:
    """One model of a run: validates its output and times its calls.

    A model is an object with ``forward(ids)`` or a plain callable ``model(ids)``;
    ``ids`` is a read-only int64 array of shape (1, L) and the result is logits of
    shape (1, L, V) in float32 or float64 (anything ``np.asarray`` views without a
    copy).  When the callable accepts a ``logits_to_keep`` keyword, it is passed the
    number of trailing rows needed and must return exactly that many.

    Parameters
    ----------
    model : object
        The model.
    name : str
        The argument name, for error messages (``"draft_model"``...).
    """

    __slots__ = ("name", "_fn", "_tree", "keeps_rows", "elapsed", "calls", "vocab_size", "dtype")

    def __init__(self, model, name: str):
        if isinstance(model, type):
            raise TypeError(
                f"{name} is the class {model.__name__}, not a model: pass an instance, "
                f"{model.__name__}(...)"
            )
        adapter = _adapter_for(model)
        if adapter is not None:
            raise TypeError(
                f"{name} is a {type(model).__module__}.{type(model).__name__}; wrap it in "
                f"specdec.models.{adapter}(model) to give specdec NumPy logits and a "
                "prefix-reusing cache"
            )
        forward = getattr(model, "forward", None)
        if callable(forward):
            fn = forward
        elif callable(model):
            fn = model
        else:
            raise TypeError(
                f"{name} must have a forward(ids) method or be callable, got {type(model).__name__}"
            )
        self.name = name
        self._fn = fn
        self.keeps_rows = accepts_logits_to_keep(fn)
        self.elapsed = 0.0
        self.calls = 0
        declared = getattr(model, "vocab_size", None)
        self.vocab_size = declared if isinstance(declared, int) and declared > 0 else None
        self.dtype = None
        tree = getattr(model, "forward_tree", None)
        self._tree = tree if callable(tree) else None

    def last_rows(self, ids: np.ndarray, n_rows: int) -> np.ndarray:
        """Logits of the last ``n_rows`` positions of ``ids``, shape (n_rows, V).

        The rows are C-contiguous (copied only if the model's array is not).
        """
        start = time.perf_counter()
        if self.keeps_rows:
            out = self._fn(ids, logits_to_keep=n_rows)
        else:
            out = self._fn(ids)
        self.elapsed += time.perf_counter() - start
        self.calls += 1

        expected = n_rows if self.keeps_rows else ids.shape[1]
        # The usual answer (a C-contiguous ndarray of the known shape and dtype) costs
        # three comparisons: a draft model is called once per draft token.
        if (
            type(out) is np.ndarray
            and out.dtype is self.dtype
            and out.shape == (1, expected, self.vocab_size)
            and out.flags.c_contiguous
        ):
            return out[0, expected - n_rows :]
        logits = np.asarray(out)
        if logits.ndim != 3 or logits.shape[0] != 1 or logits.shape[1] != expected:
            raise ValueError(
                f"{self.name} returned logits of shape {logits.shape} for {ids.shape[1]} "
                f"tokens; expected (1, {expected}, V)"
                + (f" (logits_to_keep={n_rows})" if self.keeps_rows else "")
            )
        return self._checked_rows(logits[:, expected - n_rows :])[0]

    def _checked_rows(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (1, n, V) after the dtype and vocabulary checks, C-contiguous."""
        if logits.dtype != self.dtype:
            if logits.dtype not in _LOGIT_DTYPES:
                raise TypeError(
                    f"{self.name} returned {logits.dtype} logits; expected float32 or float64"
                )
            if self.dtype is not None:
                # the draft's weights of one step share a buffer of one dtype
                raise TypeError(
                    f"{self.name} returned {logits.dtype} logits after {self.dtype} ones; "
                    "a model must keep one logits dtype"
                )
            self.dtype = logits.dtype
        vocab_size = logits.shape[2]
        if self.vocab_size is None:
            if vocab_size < 1:
                raise ValueError(f"{self.name} returned logits with an empty vocabulary")
            self.vocab_size = vocab_size
        elif vocab_size != self.vocab_size:
            raise ValueError(
                f"{self.name} returned {vocab_size} logits per row, "
                f"but its vocabulary has {self.vocab_size} tokens"
            )
        if not logits.flags.c_contiguous:
            logits = np.ascontiguousarray(logits)
        return logits

    @property
    def scores_trees(self) -> bool:
        """Whether the model scores a tree of drafts in one call (``forward_tree``)."""
        return self._tree is not None

    def tree_rows(self, prefix: np.ndarray, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """The target rows of a tree of drafts after ``prefix``, from ``forward_tree``.

        Row 0 is the logits after the prefix, row ``i + 1`` after node ``i`` (the
        prefix and the path to node i), shape ``(N + 1, V)``, C-contiguous; checked as
        :meth:`last_rows` checks ``forward``'s output.
        """
        start = time.perf_counter()
        out = self._tree(prefix, tokens, parents)
        self.elapsed += time.perf_counter() - start
        self.calls += 1
        rows = np.asarray(out)
        expected = len(tokens) + 1
        if rows.ndim != 2 or rows.shape[0] != expected:
            raise ValueError(
                f"{self.name}.forward_tree returned logits of shape {rows.shape} for a "
                f"tree of {len(tokens)} nodes; expected ({expected}, V)"
            )
        return self._checked_rows(rows[None])[0]

    def name_row(self, position: int, reason: str) -> str:
        """The verifier's row namer (:data:`specdec._verifier.RowNamer`) for this model.

        ``position`` is the sequence position whose logits the row holds (the row that
        predicts the token after it); the verifier adds the block's first position.
        """
        return (
            f"{self.name} returned {reason} at position {position} "
            f"(the row predicting token {position + 1})"
        )
