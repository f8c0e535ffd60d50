"""Evaluating tokens with llama.cpp through its public C API, asking only for the rows needed.

``llama_cpp.Llama.eval`` asks llama.cpp for the logits of *every* evaluated
position when the model was created with ``logits_all=True`` and copies them all
into ``Llama.scores``.  The decoder needs the rows of the drafted positions only:
when a prompt of a few hundred tokens is evaluated, computing its other rows
through the output layer (49,152 x 576 for SmolLM2) costs about a fifth of the
prompt's time, and copying them costs more.  :class:`TokenBatch` fills a
``llama_batch`` of its own from NumPy arrays, marks only the wanted positions as
outputs and calls ``llama_decode``; everything it uses is ``llama_cpp``'s public
low-level API.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

__all__ = ["TokenBatch"]


class TokenBatch:
    """A ``llama_batch`` for one sequence (id 0) of up to ``capacity`` tokens.

    Parameters
    ----------
    lib : module
        The ``llama_cpp`` module.
    capacity : int
        Most tokens per :meth:`decode` call (the context's ``n_batch``).
    """

    def __init__(self, lib: Any, capacity: int) -> None:
        self._lib = lib
        self.capacity = int(capacity)
        self._batch = lib.llama_batch_init(self.capacity, 0, 1)
        # Freed with the object (llama_batch_init allocates its arrays with malloc).
        self._finalizer = weakref.finalize(self, lib.llama_batch_free, self._batch)
        batch = self._batch
        for i in range(self.capacity):  # every token belongs to sequence 0, once set
            batch.seq_id[i][0] = 0
            batch.n_seq_id[i] = 1
        self._offsets = np.arange(self.capacity, dtype=np.int32)
        # NumPy views of the batch's own arrays, made once: each decode writes into
        # them.  A pass runs right after llama.cpp has streamed the weights through
        # the caches, where every Python and ctypes step is a cold one: going through
        # ctypes.memmove and ``ndarray.ctypes`` there cost about 20 us a pass.
        shape = (self.capacity,)
        self._tokens = np.ctypeslib.as_array(batch.token, shape=shape)
        self._positions = np.ctypeslib.as_array(batch.pos, shape=shape)
        self._outputs = np.ctypeslib.as_array(batch.logits, shape=shape)
        # Views of llama.cpp's logits buffer by row count, while it stays at one
        # address (np.ctypeslib.as_array on a pointer cost about 30 us a pass here).
        self._logits_address = None
        self._logits_views: dict = {}
        self._logits_at = _address_answering(lib.llama_get_logits)

    def decode(self, ctx: Any, tokens: np.ndarray, n_past: int, first_output: int) -> None:
        """Evaluate ``tokens`` at positions ``n_past...``; rows from ``first_output`` on.

        Parameters
        ----------
        ctx : llama_cpp.llama_context_p
            The context (``Llama.ctx``).
        tokens : numpy.ndarray of int32
            At most ``capacity`` tokens, C-contiguous.
        n_past : int
            Position of ``tokens[0]``; the cache must hold exactly the positions before.
        first_output : int
            Index in ``tokens`` of the first position whose logits are wanted
            (``len(tokens) - 1`` at most: llama.cpp always gets at least one output).

        Raises
        ------
        RuntimeError
            If ``llama_decode`` fails (no room in the KV cache, or an error).
        """
        n = tokens.shape[0]
        batch = self._batch
        batch.n_tokens = n
        self._tokens[:n] = tokens
        np.add(self._offsets[:n], n_past, out=self._positions[:n])
        outputs = self._outputs
        outputs[:first_output] = 0
        outputs[first_output:n] = 1
        code = self._lib.llama_decode(ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} for {n} tokens at position {n_past}")

    def logits(self, ctx: Any, n_rows: int, n_vocab: int) -> np.ndarray:
        """The output rows of ``ctx``'s last decode, a view of llama.cpp's buffer.

        The last decode may be this batch's or another one's in the same context
        (``LlamaCppTreeModel``'s trees).  Valid until the next evaluation: copy what
        must be kept.
        """
        address = self._logits_at(ctx)
        if not address:
            raise RuntimeError("llama_get_logits returned no logits")
        if address != self._logits_address:  # llama.cpp reallocated its output buffer
            self._logits_address, self._logits_views = address, {}
        shape = (n_rows, n_vocab)
        view = self._logits_views.get(shape)
        if view is None:
            floats = (ctypes.c_float * (n_rows * n_vocab)).from_address(address)
            view = self._logits_views[shape] = np.frombuffer(floats, np.float32).reshape(shape)
        return view


def _address_answering(get_logits):
    """``llama_get_logits`` answering the buffer's address as an int (None or 0: none).

    The binding answers a new ctypes pointer object, which must then be cast: about
    15 us a pass, run cold right after a decode.  The same C function called through
    a prototype that returns ``c_void_p`` gives the int directly.
    """
    if isinstance(get_logits, ctypes._CFuncPtr):
        address = ctypes.cast(get_logits, ctypes.c_void_p).value
        return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address)
    return lambda ctx: ctypes.cast(get_logits(ctx), ctypes.c_void_p).value or 0
