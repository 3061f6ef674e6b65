"""The draft tree: pure Python/NumPy, no torch (a test enforces it).

Contract:
- Node 0 is the root; it stands for the last committed token, which the target has not processed
  yet. Every other node is one drafted token. Parents always have a smaller index than their
  children, so index order is a topological order.
- `edge_logp[v]` is the best available log-probability estimate of token(v) given its path;
  `score[v]` is the path score s(v) = sum of edge_logp from the root to v (the root has 0).
- Children are unique by token: adding an existing (parent, token) pair returns the existing node
  (non-destructive grafting). Overwrite mode (an ablation) removes a parent's children, which
  marks whole subtrees dead; dead nodes keep their indices so anything keyed by index stays valid.
- Verification sees a compact copy: `prune` returns a new prefix-closed tree of live nodes within
  the budget, with the mapping back to this tree's indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROOT = 0


class DraftTree:
    """A mutable token tree with path scores; see the module docstring for invariants."""

    def __init__(self, root_token: int) -> None:
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.edge_logp: list[float] = [0.0]
        self.scores: list[float] = [0.0]
        self.children: list[dict[int, int]] = [{}]
        self.alive: list[bool] = [True]
        self.created_step: list[int] = [0]

    def copy(self) -> DraftTree:
        """An independent copy (lists are copied, so either tree can grow on its own)."""
        new = DraftTree.__new__(DraftTree)
        new.tokens = self.tokens.copy()
        new.parents = self.parents.copy()
        new.depths = self.depths.copy()
        new.edge_logp = self.edge_logp.copy()
        new.scores = self.scores.copy()
        new.children = [c.copy() for c in self.children]
        new.alive = self.alive.copy()
        new.created_step = self.created_step.copy()
        return new

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_alive(self) -> int:
        return sum(self.alive)

    def live_nodes(self) -> list[int]:
        return [v for v, ok in enumerate(self.alive) if ok]

    def add_child(self, parent: int, token: int, logp: float, step: int = 0) -> tuple[int, bool]:
        """Attach token under parent; return (node, created). An existing child is kept as is."""
        if not self.alive[parent]:
            raise ValueError(f"cannot attach to dead node {parent}")
        logp = float(logp)
        if not math.isfinite(logp):
            raise ValueError(f"edge log-prob must be finite, got {logp}")
        token = int(token)
        existing = self.children[parent].get(token)
        if existing is not None:
            return existing, False
        v = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.edge_logp.append(logp)
        self.scores.append(self.scores[parent] + logp)
        self.children.append({})
        self.alive.append(True)
        self.created_step.append(step)
        self.children[parent][token] = v
        return v, True

    def remove_children(self, parent: int) -> int:
        """Overwrite-mode helper: drop every descendant of parent. Returns how many died."""
        stack = list(self.children[parent].values())
        self.children[parent] = {}
        removed = 0
        while stack:
            v = stack.pop()
            if self.alive[v]:
                self.alive[v] = False
                removed += 1
                stack.extend(self.children[v].values())
        return removed

    def set_edge_logps(self, nodes: list[int], logps: list[float]) -> None:
        """Replace edge estimates (e.g. fresh mid-drafter log-probs) and refresh path scores."""
        for v, lp in zip(nodes, logps, strict=True):
            if v == ROOT:
                continue
            self.edge_logp[v] = float(lp)
        self.refresh_scores()

    def refresh_scores(self) -> None:
        scores = self.scores
        for v in range(1, len(self.tokens)):
            scores[v] = scores[self.parents[v]] + self.edge_logp[v]

    def path(self, v: int) -> list[int]:
        """Nodes from the root's first child down to v (excludes the root)."""
        out = []
        while v != ROOT:
            out.append(v)
            v = self.parents[v]
        out.reverse()
        return out

    def path_tokens(self, v: int) -> list[int]:
        return [self.tokens[u] for u in self.path(v)]

    def leaves(self) -> list[int]:
        return [v for v in self.live_nodes() if not self.children[v]]

    def root_to_leaf_paths(self) -> list[list[int]]:
        return [self.path(v) for v in self.leaves()]

    def ancestor_mask(self) -> np.ndarray:
        """bool [n, n]: row i is True at every ancestor of i and at i itself (all nodes)."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=bool)
        for v in range(n):
            p = self.parents[v]
            if p >= 0:
                mask[v] = mask[p]
            mask[v, v] = True
        return mask

    def positions(self, prefix_len: int) -> np.ndarray:
        """Absolute position of every node: the root sits right after the prefix_len cached tokens."""
        return prefix_len + np.asarray(self.depths, dtype=np.int64)

    def greedy_accept(self, target_next: list[int] | np.ndarray) -> list[int]:
        """Longest path that follows the target's greedy choice at every node.

        target_next[v] is the target's argmax next token after node v. Because children are unique
        by token the walk is deterministic. Returns accepted nodes (root excluded), possibly empty.
        """
        accepted = []
        v = ROOT
        while True:
            child = self.children[v].get(int(target_next[v]))
            if child is None or not self.alive[child]:
                return accepted
            accepted.append(child)
            v = child

    def prune(self, budget: int) -> PrunedTree:
        """Keep the root plus at most `budget` live nodes, best score first, ties shallower first.

        The kept set is prefix-closed: a node is taken together with any missing ancestors, and only
        if they all fit. Returns a compact tree whose index order is topological.
        """
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        live = [v for v in self.live_nodes() if v != ROOT]
        live.sort(key=lambda v: (-self.scores[v], self.depths[v], v))
        kept = {ROOT}
        for v in live:
            if len(kept) - 1 >= budget:
                break
            missing = []
            u = v
            while u not in kept:
                missing.append(u)
                u = self.parents[u]
            if len(kept) - 1 + len(missing) <= budget:
                kept.update(missing)
        return self._compact(sorted(kept))

    def _compact(self, order: list[int]) -> PrunedTree:
        """Copy the given prefix-closed, topologically sorted nodes into a fresh tree."""
        new = DraftTree(self.tokens[ROOT])
        index = {ROOT: ROOT}
        for v in order[1:]:
            u, _ = new.add_child(
                index[self.parents[v]], self.tokens[v], self.edge_logp[v], self.created_step[v]
            )
            index[v] = u
        return PrunedTree(tree=new, source=np.asarray(order, dtype=np.int64))


def top_w(tree: DraftTree, pool: list[int], width: int) -> list[int]:
    """Best `width` nodes of the pool by path score, ties shallower first, then older first.

    Two stable sorts with C-level keys (older first, then shallower first, then by score, where
    ``reverse`` keeps equal scores in their order): the order of (-score, depth, node) without a
    Python key tuple per node, which halves a scheduler decision's tree-signal time."""
    ranked = sorted(pool)
    ranked.sort(key=tree.depths.__getitem__)
    ranked.sort(key=tree.scores.__getitem__, reverse=True)
    return ranked[:width]


@dataclass(frozen=True)
class PrunedTree:
    """A compact tree and, for each of its nodes, the index it had in the tree it came from."""

    tree: DraftTree
    source: np.ndarray
