"""Tree verification for engines: several candidates scored in one target pass.

A single draft path wastes the target's pass when its first token is wrong; a tree of
candidates (prompt lookup's several continuations, a suffix tree's branches, k sampled
children per node of a draft model) keeps more tokens per pass.  :func:`verify_tree`
is the verification step for such a tree (SpecInfer's multi-step speculative
sampling, Miao et al. 2024): the kernels' ``verify_tree`` walks it from the root, and
a tree that is one path makes exactly the decisions of token-by-token :func:`verify`.

Inputs are validated by :func:`specdec.verify`'s own checks
(``specdec._engine_inputs.validate``: DLPack and array-protocol producers, one copy for
non-contiguous rows, nothing written to the caller's arrays), then the parents; every
check that needs no row values comes before any work.
"""

from __future__ import annotations

import numpy as np

from specdec._common import check_tree
from specdec._deprecation import renamed_arguments
from specdec._engine_inputs import as_array, validate
from specdec._engine_run import draft_law

__all__ = ["verify_tree"]


def _parents(value, n_nodes: int) -> np.ndarray:
    """The parent indices as int64: -1 (the root) or an earlier node, one per node."""
    array = as_array(value, "parents")
    if array.ndim != 1:
        raise ValueError(f"parents must be 1-D, (N,) parent indices, got shape {array.shape}")
    if array.size == 0 and array.dtype.kind not in "iu":  # [] is float64 to NumPy
        array = array.astype(np.int64)
    check_tree(array, n_nodes, "parents")  # before the cast: uint64 beyond int64 is refused
    return array.astype(np.int64, copy=False)


@renamed_arguments("verify_tree()", token_ids="draft_token_ids")
def verify_tree(
    draft_token_ids,
    parents,
    target_logits,
    draft=None,
    *,
    draft_kind="logits",
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    rng=None,
    backend=None,
):
    """Verify a tree of N candidate tokens against the target's N + 1 rows; keep a path.

    At each node (the root first), the node's children are tried in index order:
    child x is kept with probability min(1, p(x) / q(x)) (p(x) for one-hot drafts),
    and the walk descends to it; after a rejection p becomes norm(max(0, p - q))
    (one-hot: p without x, renormalised) and the next child is tried.  When no child
    is kept, the next token is drawn from the current p.  The emitted tokens (the
    path's, then the next token) follow exactly the target's law under the sampling
    controls, when the children of a node are independent draws from their draft laws
    (or deterministic proposals, ``draft=None``).

    Parameters
    ----------
    draft_token_ids : array-like of int, shape (N,)
        Each node's token, in [0, V); N >= 0 (the name :func:`specdec.verify` uses;
        ``token_ids`` is its deprecated alias until 0.4).
    parents : array-like of int, shape (N,)
        Each node's parent: -1 for a child of the root, else the index of an earlier
        node (``parents[i] < i``).
    target_logits : array of float32 or float64, shape (N + 1, V)
        The target's logits: row 0 at the root, row i + 1 after node i (on the path
        from the root to node i).
    draft : array of float32 or float64, shape (N, V), or None
        Row i: the law node i was drawn from (siblings, drawn from their parent's
        draft law, carry the same row), as logits (``draft_kind="logits"``, q being
        their law under the sampling controls) or probabilities
        (``draft_kind="probs"``); None when the nodes are deterministic proposals
        (one-hot drafts).  A node whose token has draft probability 0 is refused
        (except at temperature 0).
    draft_kind : {"logits", "probs"}, default "logits"
        What ``draft`` holds (ignored when it is None).
    temperature, top_k, top_p, min_p
        Sampling controls of both models, as for :func:`specdec.verify`; temperature 0
        descends to the child equal to the target's argmax (the lowest id among its
        maxima) and draws no random number.
    rng : numpy.random.Generator or int, optional
        The uniforms' source (one per child tried, one for the next token); an int
        seeds a new generator; default: a seed drawn from NumPy's global state.
    backend : {"cython", "python"}, optional
        Kernel backend; default :data:`specdec.BACKEND`.  Both make the same decisions
        from the same seed.

    Returns
    -------
    path : ndarray of int64, shape (depth,)
        The kept nodes' indices, root to leaf (empty when the root's children are all
        rejected, or N = 0).
    next_token : int
        The token drawn after the last kept node.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named, before any work: a parent not smaller than its node or
        below -1, rows of the wrong count or shape, ids outside the vocabulary, bad
        dtypes.  Rows that define no law (NaN or +inf, all -inf), bad draft
        probabilities, or a node of draft probability 0, named by their row; target
        row errors may come after uniforms were drawn.

    Examples
    --------
    >>> import numpy as np
    >>> import specdec
    >>> rng = np.random.default_rng(0)
    >>> target = rng.standard_normal((4, 10))  # root, then after nodes 0, 1, 2
    >>> # two candidates after the root (tokens 3 and 5), one more after the first
    >>> path, token = specdec.verify_tree([3, 5, 1], [-1, -1, 0], target, rng=1)
    """
    step = validate(
        draft_token_ids,
        draft,
        target_logits,
        lengths=None,
        draft_kind=draft_kind,
        controls=(temperature, top_k, top_p, min_p),
        verification="token",
        rngs=rng,
        backend=backend,
        single=True,
    )
    ids, target, verifier = step.ids[0], step.target[0], step.verifier
    n_nodes, vocab = len(ids), target.shape[1]
    tree = draft_law(step, 0, n_nodes, ids, _parents(parents, n_nodes))
    path, token = verifier.verify_tree(
        target,
        tree,
        controls=step.controls,
        rng=step.generators[0],
        workspace=verifier.thread_workspace(vocab),
        name_row=lambda row, reason: f"target_logits[{row}] holds {reason}",
    )
    return path.copy(), token
