"""The adaptive draft-length policies kept for a target model, across decoders.

A :class:`~specdec.drafters.PositionalDraftLength` learns how often drafts are kept,
by source, strength of evidence and position.  What it learns is a property of the
target model and the draft sources, not of the decoder object that happened to ask:
a server that makes a new :class:`~specdec.SpeculativeDecoder` per request would
otherwise pay for the learning on every request (on open text, drafts that a
policy which had seen a few requests would decline: 1.5% of the speed in the replay
simulator, docs/performance.md).

So an adapter that measures its cost curve (``LlamaCppModel``, ``TransformersModel``)
keeps a :class:`DraftPolicies` as ``draft_policies``, beside its ``cost_check``, and
every decoder with ``draft_length="auto"`` or ``"adaptive"`` drafting for it uses the
policy kept there.  A model without one (any object with ``forward``, or an adapter
given its cost curve) gets a policy per decoder, so that a run is reproducible from
its seed, its cost curve and its decoder's history alone.

Policies are kept per kind of draft sources (the classes in the chain, as the
decoder names them) and per decoding mode: acceptance under greedy decoding (a draft
token is kept when it is the target's argmax) is not acceptance under sampling.
"""

from __future__ import annotations

import threading

from specdec.drafters.positional import PositionalDraftLength

__all__ = ["DraftPolicies"]


class DraftPolicies:
    """Adaptive draft-length policies, one per kind of draft sources and decoding mode.

    One store may serve several threads: :meth:`policy` is guarded by a lock (the
    policies themselves, like the models they serve, are used by one request at a
    time).

    Examples
    --------
    >>> from specdec.drafters import DraftPolicies
    >>> store = DraftPolicies()
    >>> policy = store.policy(["PromptLookup"], greedy=True)
    >>> policy is store.policy(["PromptLookup"], greedy=True)
    True
    >>> policy is store.policy(["PromptLookup"], greedy=False)
    False
    >>> len(store), store.clear(), len(store)
    (2, None, 0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: dict = {}  # (source names, greedy) -> PositionalDraftLength

    def __getstate__(self) -> dict:
        with self._lock:
            return {"_policies": dict(self._policies)}

    def __setstate__(self, state: dict) -> None:
        self._lock = threading.Lock()
        self._policies = state["_policies"]

    def __len__(self) -> int:
        return len(self._policies)

    def __repr__(self) -> str:
        return f"DraftPolicies({len(self)} policies)"

    def policy(self, names, greedy: bool) -> PositionalDraftLength:
        """The policy for draft sources ``names`` in one decoding mode; made on first use.

        Parameters
        ----------
        names : sequence of str
            The draft sources' names, as :attr:`specdec.drafters.Chain.names` gives them.
        greedy : bool
            Whether decoding is greedy (temperature 0).

        Returns
        -------
        PositionalDraftLength
        """
        key = (tuple(names), bool(greedy))
        with self._lock:
            found = self._policies.get(key)
            if found is None:
                found = self._policies[key] = PositionalDraftLength()
            return found

    def clear(self) -> None:
        """Forget every policy, hence everything they learnt."""
        with self._lock:
            self._policies.clear()
