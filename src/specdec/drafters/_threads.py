"""State that one drafter or policy instance keeps per thread, for instances shared by threads.

A drafter (or a draft-length policy) serves one sequence at a time: its per-request
state (the sequence indexed, the last proposal's evidence) belongs to the request,
while what it learns across requests (an n-gram table, a suffix tree of earlier
outputs, acceptance estimates) belongs to the instance.  When one instance serves
several threads (a server's thread pool sharing one decoder and drafter), each thread
is serving its own request, so the per-request state is kept per thread
(:class:`PerThread`), and what is shared is guarded by the instance's lock.
"""

from __future__ import annotations

import threading

__all__ = ["PerThread", "SharedState"]


class PerThread:
    """A data attribute with one value per thread (a descriptor).

    Each thread first sees ``factory()``; assignments are seen by the assigning
    thread only.  The values live in a :class:`threading.local` kept in the
    instance's ``__dict__``, so they go when their thread ends.

    Parameters
    ----------
    factory : callable
        ``factory() -> value``: a thread's value before it assigns one.
    """

    def __init__(self, factory) -> None:
        self._factory = factory
        self._key = None

    def __set_name__(self, owner, name: str) -> None:
        self._key = name

    def _local(self, obj) -> threading.local:
        local = obj.__dict__.get("_per_thread")
        if local is None:  # setdefault is atomic: two threads get the same one
            local = obj.__dict__.setdefault("_per_thread", threading.local())
        return local

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        # The usual case first, in one expression: a drafter reads its per-thread
        # state a dozen times a step.
        try:
            return getattr(obj.__dict__["_per_thread"], self._key)
        except (KeyError, AttributeError):
            pass
        local = self._local(obj)
        try:
            return getattr(local, self._key)
        except AttributeError:
            value = self._factory()
            setattr(local, self._key, value)
            return value

    def __set__(self, obj, value) -> None:
        try:
            local = obj.__dict__["_per_thread"]
        except KeyError:
            local = self._local(obj)
        setattr(local, self._key, value)


class SharedState:
    """Mixin: a reentrant ``_lock`` for shared state, dropped from copies and pickles.

    A copy (or an unpickled instance) gets a fresh lock and starts with no per-thread
    state (each thread's first access sees the attributes' defaults).
    """

    @property
    def _lock(self) -> threading.RLock:
        lock = self.__dict__.get("_shared_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_shared_lock", threading.RLock())
        return lock

    def __getstate__(self) -> dict:
        with self._lock:
            state = self.__dict__.copy()
        state.pop("_shared_lock", None)
        state.pop("_per_thread", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
