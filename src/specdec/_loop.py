"""The decoding loops, speculative and plain: generators of per-pass tokens.

Each loop runs on a checked :class:`~specdec._streaming.Run` (the token buffer, its
read-only view, the stats) and yields, after every target pass, a read-only view of
the tokens that pass made final.  :mod:`specdec._decoder` checks the arguments and
builds the run; :mod:`specdec._streaming` consumes the passes (``generate``,
``stream``).

A speculative step: the draft sources (a :class:`~specdec.drafters.Chain`) are asked
for a proposal; the draft-length policy decides how many of its tokens to verify (a
draft model is sampled token by token, through the verifier, up to that many); the
target scores them in one call; the verifier keeps a prefix and draws the next token.
The policy sees only what is known before the target pass, so it cannot change the
output law.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specdec._calling import ModelCaller
from specdec._model_drafts import (
    check_first_call,
    check_same_vocab,
    draft_from_model,
    nodes_per_depth,
    sampled_tree,
)
from specdec._streaming import Run
from specdec._validation import SamplingControls, check_token_range
from specdec._verifier import Draft, Verifier
from specdec.drafters.chain import Chain
from specdec.drafters.length import DraftLengthPolicy
from specdec.drafters.tree import DraftTree

_NO_PROPOSAL = np.zeros(0, dtype=np.int64)


class Plan(NamedTuple):
    """The settings of one speculative run, fixed when it starts."""

    verifier: Verifier
    controls: SamplingControls
    block: bool  # block verification of sampled drafts (one-hot ones: token by token)
    max_tokens: int  # the most draft tokens (or tree nodes) per step
    model_max_tokens: int  # ... when they come from the draft model
    policy: DraftLengthPolicy
    tree_width: int  # the most candidates per tree of drafts; 0: chains only


def check_declared_vocab(prompt, eos, *callers: ModelCaller) -> None:
    """Check ids against the vocabulary the models declare, before any call."""
    declared = [
        caller.vocab_size
        for caller in callers
        if caller is not None and caller.vocab_size is not None
    ]
    if len(declared) == 2:
        check_same_vocab(*declared)
    if declared:
        check_token_range(prompt, eos, declared[0])


def _check_proposal_range(drafted: np.ndarray, vocab_size: int | None, name: str) -> None:
    """A drafter's ids must lie in the target's vocabulary (once it is known)."""
    if vocab_size is not None and drafted.max() >= vocab_size:
        raise ValueError(
            f"drafter {name} proposed token id {drafted.max()}, outside the "
            f"target's vocabulary [0, {vocab_size})"
        )


def draft_length(policy: DraftLengthPolicy, key, offered: int) -> int:
    """``policy.length(key, offered)``, refused clearly unless an int in [0, offered]."""
    answer = policy.length(key, offered)
    if type(answer) is int and 0 <= answer <= offered:  # the common case, on every step
        return answer
    expected = f"expected an int in [0, {offered}] (the tokens offered)"
    where = f"draft-length policy {type(policy).__name__}.length() returned {answer!r}"
    if isinstance(answer, bool) or not isinstance(answer, (int, np.integer)):
        raise TypeError(f"{where} ({type(answer).__name__}); {expected}")
    if not 0 <= answer <= offered:
        raise ValueError(f"{where}; {expected}")
    return int(answer)


class Drafted(NamedTuple):
    """What one step drafted: the target pass verifies it, the policy observes it."""

    source: int  # the draft source (an index into the chain's names); -1: none
    key: tuple  # (source, evidence): the policy's cell
    n_draft: int  # chain tokens written at run.tokens[start:]; 0 for a tree
    proposal: np.ndarray | None  # the drafter's proposal; None: the draft model drew
    tree: DraftTree | None = None  # the tree the policy selected from, if any
    selected: np.ndarray | None = None  # ... and its selection
    as_tree: bool = False  # verify the selection as a tree (else: a prefix chain)
    draft_rows: tuple | None = None  # a sampled tree's (laws, weights, rows)
    draft_dtype: np.dtype | None = None  # the draft model's rows' dtype


def speculate(run: Run, *, chain: Chain, draft, target: ModelCaller, plan: Plan, rng, eos):
    """The speculative loop over a checked run: yields each pass's final tokens.

    ``draft`` is the chain's draft model wrapped in a :class:`ModelCaller` (None
    without one).  Each step drafts (:func:`_draft`), is verified as a chain
    (:func:`_chain_pass`) or a tree (:func:`_tree_pass`), and is observed by the
    policy after the pass.
    """
    policy, stats, names = plan.policy, run.stats, chain.names
    work = None  # this run's buffers, made once the vocabulary is known
    chain.start(run.sequence())
    # a draft model alone has no drafter to ask first
    draft_step = _draft_from_model if draft is not None and not chain.drafters else _draft
    while run.length < run.limit:
        start = run.length
        max_tokens = min(plan.max_tokens, run.limit - start)
        run.reserve(start + max_tokens + 1)
        step, work = draft_step(
            run, start, max_tokens, chain=chain, draft=draft, target=target, plan=plan,
            rng=rng, work=work, eos=eos,
        )  # fmt: skip
        if step.as_tree:
            name = names[step.source]
            new, n_kept, token, path, seconds, work = _tree_pass(
                run, start, step, name=name, draft=draft, target=target, plan=plan,
                rng=rng, work=work, eos=eos,
            )  # fmt: skip
            stats.record_step(name, int(np.count_nonzero(step.selected)), n_kept, new)
            policy.observe_tree(step.key, step.tree, step.selected, path, token, seconds)
        else:
            new, n_kept, token, seconds, work = _chain_pass(
                run, start, step, names=names, draft=draft, target=target, plan=plan,
                rng=rng, work=work, eos=eos,
            )  # fmt: skip
            stats.record_step(
                names[step.source] if step.n_draft else None, step.n_draft, n_kept, new
            )
            _observe_chain(policy, step, n_kept, token, seconds)
        if chain.drafters:
            chain.extend(run.sequence(), new)
        yield run.pause(start)
        run.resume()
        if eos is not None and run.tokens[run.length - 1] == eos:
            break


def _draft(run, start, max_tokens, *, chain, draft, target, plan, rng, work, eos):
    """Ask the draft sources, let the policy size the draft, write its chain's tokens.

    Returns ``(step, work)``: the :class:`Drafted` and the workspace (made here when the
    draft model is the first model evaluated).
    """
    policy = plan.policy
    candidates = None
    # A pass yields at most its drafts plus one token, so drafts that reach the run's
    # limit leave the last one's row unused: a drafter drafts one token fewer there (as
    # many tokens, one row less).  A draft model keeps the reference loop's bound.
    room = min(max_tokens, run.limit - start - 1)
    if room <= 0:
        proposal = _NO_PROPOSAL
    elif plan.tree_width:
        candidates = chain.propose_candidates(run.sequence(), room, plan.tree_width)
        proposal = candidates[0] if candidates else _NO_PROPOSAL
    else:
        proposal = chain.propose(run.sequence(), room)
    if not len(proposal):
        if draft is None:
            return Drafted(-1, (-1, None), 0, proposal), work
        return _draft_from_model(
            run, start, max_tokens, chain=chain, draft=draft, target=target, plan=plan,
            rng=rng, work=work, eos=eos,
        )  # fmt: skip
    source = chain.last_source
    key = (source, chain.last_evidence)
    if candidates is not None and len(candidates) > 1:
        if eos is not None:
            candidates = [_cut_after(c, eos) for c in candidates]
            proposal = candidates[0]
        tree = DraftTree.from_candidates(candidates)  # the best candidate: nodes 0, 1, ...
        selected = _selection(policy, key, tree, plan.max_tokens)
        n_first = int(np.count_nonzero(selected[: len(proposal)]))
        if np.count_nonzero(selected) > n_first or not selected[:n_first].all():
            return Drafted(source, key, 0, proposal, tree, selected, as_tree=True), work
        # the selection is a prefix of the best candidate: verified as a chain
        n_draft = n_first
        step = Drafted(source, key, n_draft, proposal, tree, selected)
    else:
        n_draft = draft_length(policy, key, len(proposal))
        if eos is not None and n_draft:
            hits = np.flatnonzero(proposal[:n_draft] == eos)
            n_draft = int(hits[0]) + 1 if len(hits) else n_draft
        step = Drafted(source, key, n_draft, proposal)
    if n_draft:
        run.tokens[start : start + n_draft] = proposal[:n_draft]
        _check_proposal_range(
            run.tokens[start : start + n_draft], target.vocab_size, chain.names[source]
        )
    return step, work


def _draft_from_model(run, start, max_tokens, *, chain, draft, target, plan, rng, work, eos):
    """The draft model's turn: a sampled chain, or a tree when the policy selects one."""
    policy = plan.policy
    key = (chain.model_source, None)
    offered = min(max_tokens, plan.model_max_tokens)
    levels = _sampled_levels(policy, key, offered, plan)
    n_draft, work, dtype, siblings = draft_from_model(
        draft,
        run,
        start=start,
        max_tokens=draft_length(policy, key, offered) if levels is None else len(levels),
        p_min=policy.p_min,
        target=target,
        verifier=plan.verifier,
        controls=plan.controls,
        rng=rng,
        work=work,
        eos=eos,
        levels=levels,
    )
    if not any(siblings):
        return Drafted(key[0], key, n_draft, None, draft_dtype=dtype), work
    tree, rows = sampled_tree(run.tokens[start : start + n_draft], siblings, len(levels))
    laws, weights = work.draft_rows(1, dtype)  # the buffers; rows says which node is where
    every = np.ones(len(tree), dtype=bool)
    step = Drafted(key[0], key, 0, None, tree, every, True, (laws, weights, rows), dtype)
    return step, work


def _chain_pass(run, start, step, *, names, draft, target, plan, rng, work, eos):
    """Score the step's chain in one target pass, verify it, append what is kept.

    Returns ``(new, n_kept, token, seconds, work)``: tokens appended, drafts kept, the
    token drawn after them (-1 if none), the target's time, and the workspace.
    """
    n_draft, verifier = step.n_draft, plan.verifier
    seconds = target.elapsed
    rows = target.last_rows(run.ids[:, : start + n_draft], n_draft + 1)
    seconds = target.elapsed - seconds
    work = _after_target_call(run, eos, target, draft, verifier, work)
    drafted = run.tokens[start : start + n_draft]
    if target.calls == 1 and n_draft and step.proposal is not None:
        _check_proposal_range(drafted, target.vocab_size, names[step.source])
    if step.proposal is None and n_draft:
        laws, weights = work.draft_rows(n_draft, step.draft_dtype)
        record = Draft(drafted, weights, laws)
    else:
        record = Draft(drafted)
    bonus = (n_draft == 0 or drafted[-1] != eos) and start + n_draft < run.limit
    n_kept, token = verifier.verify(
        rows,
        record,
        bonus=bonus,
        # One-hot drafts keep exactly as many tokens in expectation under both
        # schemes (tests/test_kernels_block.py), and token verification costs less.
        block=plan.block and not record.one_hot,
        controls=plan.controls,
        rng=rng,
        workspace=work,
        name_row=target.name_row,
        first_row=start - 1,
    )
    return _append(run, start, n_kept, token), n_kept, token, seconds, work


def _after_target_call(run, eos, target: ModelCaller, draft, verifier, work):
    """The checks that wait for the target's vocabulary, and the run's buffers.

    After the target's first call its vocabulary is known (a model need not declare
    it): the prompt, ``eos`` and a draft model's vocabulary are checked against it,
    once, here for every loop.  Returns the run's buffers, made now if no draft model
    made them first.
    """
    if target.calls == 1:
        check_first_call(run, eos, called=target, draft=draft, target=target)
    return verifier.workspace(target.vocab_size) if work is None else work


def _append(run, start: int, n_kept: int, token: int) -> int:
    """End a pass: the kept drafts are at ``start``; add ``token`` (if drawn); the new count."""
    new = n_kept
    if token >= 0:
        run.tokens[start + n_kept] = token
        new += 1
    run.length = start + new
    return new


def _observe_chain(policy, step: Drafted, n_kept: int, token: int, seconds: float) -> None:
    """Tell the policy what a chain's pass kept (a source's free shadow included)."""
    if step.selected is not None:  # a prefix of a tree of candidates
        policy.observe_tree(step.key, step.tree, step.selected, np.arange(n_kept), token, seconds)
    elif step.source >= 0:
        shadow = None  # was the token after the verified drafts the proposal's next one?
        proposal, n_draft = step.proposal, step.n_draft
        if proposal is not None and len(proposal) > n_draft == n_kept and token >= 0:
            shadow = bool(token == proposal[n_draft])
        policy.observe(step.key, n_draft, n_kept, seconds, shadow)


def _sampled_levels(policy, key, offered: int, plan: Plan) -> list | None:
    """Nodes per depth of a draft model's tree, as the policy selects them; None: a chain.

    Only when the target scores trees and tokens are drawn at random (greedy draws
    from one row are all the same token).  The policy chooses the shape before any
    token is drawn (see :mod:`specdec._model_drafts`).
    """
    if plan.tree_width < 2 or plan.controls.temperature == 0.0 or offered == 0:
        return None
    shape = DraftTree.sampled_shape(offered, plan.tree_width)
    return nodes_per_depth(shape, _selection(policy, key, shape, plan.max_tokens))


def _cut_after(candidate: np.ndarray, eos: int) -> np.ndarray:
    """``candidate`` up to and including its first ``eos`` (nothing is drafted past it)."""
    hits = np.flatnonzero(candidate == eos)
    return candidate[: int(hits[0]) + 1] if len(hits) else candidate


def _selection(policy, key, tree: DraftTree, max_tokens: int) -> np.ndarray:
    """``policy.select_tree(key, tree)``, refused clearly unless a closed boolean mask."""
    answer = policy.select_tree(key, tree)
    where = f"draft-length policy {type(policy).__name__}.select_tree()"
    mask = np.asarray(answer)
    if mask.dtype != np.bool_ or mask.shape != (len(tree),):
        raise TypeError(
            f"{where} returned {type(answer).__name__} of dtype {mask.dtype} and shape "
            f"{mask.shape}; expected a boolean mask of shape ({len(tree)},)"
        )
    n_selected = int(np.count_nonzero(mask))
    if n_selected > max_tokens:
        raise ValueError(f"{where} selected {n_selected} nodes, more than {max_tokens}")
    parents = tree.parents[mask]
    if not mask[parents[parents >= 0]].all():
        raise ValueError(f"{where} selected a node without its parent")
    return mask


def _tree_pass(run, start, step: Drafted, *, name, draft, target, plan, rng, work, eos):
    """Score the step's selected nodes as one tree, verify them, append the kept path.

    ``step.draft_rows``: for sampled drafts, ``(laws, weights, rows)``: the workspace's
    draft buffers and each node's row in them; None for one-hot drafts.

    Returns ``(new, n_kept, token, path, seconds, work)``: tokens appended, nodes kept,
    the token drawn after them (-1 if dropped: after ``eos`` or at the run's end), the
    kept nodes as indices of ``tree``, the target's time, and the workspace.
    """
    nodes = np.flatnonzero(step.selected)
    sub = step.tree.subtree(step.selected)
    _check_proposal_range(sub.tokens, target.vocab_size, name)
    seconds = target.elapsed
    target_rows = target.tree_rows(run.ids[0, :start], sub.tokens, sub.parents)
    seconds = target.elapsed - seconds
    work = _after_target_call(run, eos, target, draft, plan.verifier, work)
    if target.calls == 1:
        _check_proposal_range(sub.tokens, target.vocab_size, name)

    def name_row(row: int, reason: str) -> str:
        where = "after the sequence" if row == 0 else f"after tree node {row - 1}"
        return f"{target.name}.forward_tree returned {reason} in row {row} ({where})"

    if step.draft_rows is None:
        record = Draft(sub.tokens, parents=sub.parents)
    else:
        laws, weights, rows = step.draft_rows
        index = rows[nodes]
        n = len(index)
        if n and index[-1] - index[0] == n - 1:  # rows in node order (a full chain): views
            index = slice(int(index[0]), int(index[0]) + n)
        record = Draft(sub.tokens, weights[index], laws[index], sub.parents)
    path, token = plan.verifier.verify_tree(
        target_rows,
        record,
        controls=plan.controls,
        rng=rng,
        workspace=work,
        name_row=name_row,
    )
    n_kept = len(path)
    kept = sub.tokens[path]
    run.tokens[start : start + n_kept] = kept
    if (n_kept and kept[-1] == eos) or start + n_kept >= run.limit:
        token = -1  # drawn, but past the end of the output
    return _append(run, start, n_kept, token), n_kept, token, nodes[path], seconds, work


def sample_plainly(run: Run, *, target: ModelCaller, verifier: Verifier, controls, rng, eos):
    """Plain sampling's loop over a checked run: one target pass, one token, yielded."""
    work = None
    while run.length < run.limit:
        run.reserve(run.length + 1)
        row = target.last_rows(run.ids[:, : run.length], 1)[0]
        work = _after_target_call(run, eos, target, None, verifier, work)
        token = verifier.sample(
            row,
            slot=0,
            controls=controls,
            rng=rng,
            workspace=work,
            name_row=target.name_row,
            first_row=run.length - 1,
        )
        run.tokens[run.length] = token
        run.length += 1
        run.stats.record_step(None, 0, 0, 1)
        yield run.pause(run.length - 1)
        run.resume()
        if token == eos:
            break
