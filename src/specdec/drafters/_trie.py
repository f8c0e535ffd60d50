"""A depth-limited suffix trie with occurrence counts: the index of :class:`SuffixDrafter`.

Every substring of up to ``max_depth`` tokens of the sequences added is a path from
the root; a node's ``count`` is the number of occurrences of its substring, and its
``cont`` the number of those that continue past it (the sum of its children's
counts).  Each node remembers its most frequent child (ties: the one reinforced most
recently), so that the most likely continuation is found without scanning siblings.

Nodes live in flat lists indexed by node id (a Python object per node would cost
several times the memory); ids of removed nodes are reused.  Appending one token to a
sequence touches at most ``max_depth`` nodes: the nodes of the suffixes that end at
the previous token (the *active* nodes), each extended by the new token.
"""

from __future__ import annotations

__all__ = ["SuffixTrie"]

ROOT = 0


class SuffixTrie:
    """The trie of every substring (of at most ``max_depth`` tokens) of some sequences.

    Parameters
    ----------
    max_depth : int
        Longest substring indexed.
    """

    __slots__ = (
        "max_depth",
        "children",
        "count",
        "cont",
        "best",
        "stamp",
        "token",
        "parent",
        "_free",
        "_clock",
    )

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.children: list = [None]  # node -> {token: child}, None while it has none
        self.count = [0]  # occurrences of the node's substring
        self.cont = [0]  # occurrences that continue past it
        self.best = [-1]  # most frequent child (ties: reinforced last), -1 if none
        self.stamp = [0]  # when the node was last reinforced
        self.token = [-1]  # the token on the edge from its parent
        self.parent = [-1]
        self._free: list = []
        self._clock = 0

    @property
    def n_nodes(self) -> int:
        """Nodes in use, the root included."""
        return len(self.count) - len(self._free)

    # -- adding ---------------------------------------------------------------------

    def _child(self, node: int, token: int) -> int:
        """The child of ``node`` by ``token``, created if missing."""
        kids = self.children[node]
        if kids is None:
            kids = self.children[node] = {}
        child = kids.get(token)
        if child is None:
            if self._free:
                child = self._free.pop()
                self.children[child] = None
                self.count[child] = self.cont[child] = 0
                self.best[child] = -1
                self.token[child] = token
                self.parent[child] = node
            else:
                child = len(self.count)
                self.children.append(None)
                self.count.append(0)
                self.cont.append(0)
                self.best.append(-1)
                self.stamp.append(0)
                self.token.append(token)
                self.parent.append(node)
            kids[token] = child
        return child

    def append(self, active: list, token: int) -> list:
        """Count the suffixes ending at ``token``, appended after the ``active`` ones.

        Parameters
        ----------
        active : list of int
            The nodes of the suffixes that end at the previous token, shortest first
            (``active[k]`` has depth ``k + 1``); empty at the start of a sequence.
        token : int
            The appended token.

        Returns
        -------
        list of int
            The nodes of the suffixes that end at ``token``, shortest first.
        """
        children, count, cont, best, stamp = (
            self.children,
            self.count,
            self.cont,
            self.best,
            self.stamp,
        )
        self._clock += 1
        clock = self._clock
        # the suffix of length 1 hangs from the root (whose best child is never asked for)
        kids = children[ROOT]
        child = kids.get(token) if kids else None
        if child is None:
            child = self._child(ROOT, token)
        count[child] += 1
        stamp[child] = clock
        new = [child]
        for node in active[: self.max_depth - 1]:
            kids = children[node]
            child = kids.get(token) if kids else None
            if child is None:
                child = self._child(node, token)
            count[child] += 1
            stamp[child] = clock
            cont[node] += 1
            top = best[node]
            if top != child and (top < 0 or count[child] >= count[top]):
                best[node] = child
            new.append(child)
        return new

    def add(self, tokens) -> None:
        """Index every substring of ``tokens`` (a sequence of int) up to ``max_depth``."""
        active: list = []
        for token in tokens:
            active = self.append(active, token)

    def remove(self, tokens) -> None:
        """Undo :meth:`add` of the same ``tokens``; nodes left with no occurrence are freed.

        Costs ``O(len(tokens) * max_depth)`` plus a scan of the siblings of each node
        that lost its most frequent child.
        """
        count, cont, best, children = self.count, self.cont, self.best, self.children
        depth = self.max_depth
        active: list = []
        dirty, emptied = set(), []
        for token in tokens:
            new = []
            for node in [ROOT, *active[: depth - 1]]:
                child = children[node][token]
                count[child] -= 1
                if count[child] == 0:
                    emptied.append(child)
                if node != ROOT:
                    cont[node] -= 1
                    if best[node] == child:
                        dirty.add(node)
                new.append(child)
            active = new
        for node in emptied:
            parent = self.parent[node]
            # the top of an emptied subtree (its parent still occurs): detach and free it
            if parent == ROOT or count[parent] > 0:
                kids = children[parent]
                del kids[self.token[node]]
                if not kids:
                    children[parent] = None
                self._release(node)
        for node in sorted(dirty):
            if count[node] > 0:
                self._recompute_best(node)

    def _recompute_best(self, node: int) -> None:
        count, stamp = self.count, self.stamp
        top = -1
        for child in (self.children[node] or {}).values():
            if top < 0 or (count[child], stamp[child]) > (count[top], stamp[top]):
                top = child
        self.best[node] = top

    def _release(self, node: int) -> None:
        stack = [node]
        while stack:
            node = stack.pop()
            kids = self.children[node]
            if kids:
                stack.extend(kids.values())
            self.children[node] = None
            self.best[node] = -1
            self._free.append(node)

    # -- matching and proposing -----------------------------------------------------

    def step(self, active: list, token: int) -> list:
        """Follow ``token`` from the ``active`` matches without changing the trie.

        Parameters
        ----------
        active : list of int
            Nodes matching the suffixes of a context (not indexed in this trie) of
            lengths 1, 2, ..., shortest first.
        token : int
            The token appended to the context.

        Returns
        -------
        list of int
            The nodes matching the new context's suffixes, shortest first (the matches
            of lengths 1..k for some k: a substring's substrings are all indexed).
        """
        children = self.children
        new = []
        for node in [ROOT, *active[: self.max_depth - 1]]:
            kids = children[node]
            child = kids.get(token) if kids else None
            if child is None:
                break
            new.append(child)
        return new

    def match(self, context) -> list:
        """The nodes matching the suffixes of ``context`` (a sequence of int), shortest first."""
        active: list = []
        for token in context[-self.max_depth :]:
            active = self.step(active, token)
        return active

    def walk_path(self, node: int, max_tokens: int, min_prob: float):
        """The most frequent continuation of ``node``: one path of the trie.

        Descends to the most frequent child while the product of the branch
        frequencies (``count(child) / cont(node)``, the estimated chance of the path)
        stays at least ``min_prob``.

        Returns
        -------
        tokens, probs : list of int, list of float
        """
        count, cont, best, token = self.count, self.cont, self.best, self.token
        tokens, probs = [], []
        prob = 1.0
        while len(tokens) < max_tokens:
            child = best[node]
            if child < 0:
                break
            prob *= count[child] / cont[node]
            if prob < min_prob:
                break
            tokens.append(token[child])
            probs.append(prob)
            node = child
        return tokens, probs

    def branches(self, node: int, path: list, max_tokens: int, min_prob: float, k: int):
        """Up to ``k`` alternatives to ``path`` (``walk_path(node, ...)``'s tokens).

        Each leaves the path at some node of it (``node`` itself or one of the path's
        nodes) by another child than the path's, then follows the most frequent
        children (as :meth:`walk_path`); the alternatives whose first new token is the
        most probable (the product of the branch frequencies down to it, at least
        ``min_prob``) come first.

        Returns
        -------
        list of list of int
            Whole candidates (the shared part of ``path``, then the branch).
        """
        count, cont, children, best = self.count, self.cont, self.children, self.best
        options = []  # (probability, depth on the path, child)
        prob, at = 1.0, node
        for depth in range(min(len(path), max_tokens)):
            kids = children[at]
            if kids and cont[at]:
                for child in kids.values():
                    if child == best[at]:
                        continue
                    p = prob * count[child] / cont[at]
                    if p >= min_prob:
                        options.append((p, depth, child))
            nxt = best[at]
            if nxt < 0:
                break
            prob *= count[nxt] / cont[at]
            at = nxt
        options.sort(key=lambda option: (-option[0], option[1]))
        out = []
        for p, depth, child in options[:k]:
            rest, _ = self.walk_path(child, max_tokens - depth - 1, min_prob / p)
            out.append(path[:depth] + [self.token[child]] + rest)
        return out
