"""DDTree assembly: the best draft tree of B nodes from per-position marginals (pure Python/NumPy).

A block drafter gives, for each future position d = 1..K, its top-m tokens and log-probs, best
first (decoder/graft/block.py, `Marginals`). Under the surrogate "the drafter's joint is the product of
its marginals" a node is a prefix of ranks (r_1, .., r_d) into those lists, scored by
s = logp[0, r_1] + .. + logp[d-1, r_d], and the expected accepted length of a tree is the sum of
exp(s) over its nodes, so the best tree of B nodes holds the B best prefixes.

Best-first search finds them exactly: a max-heap starts with (rank 0 at depth 1); each pop adds
the prefix to the tree and pushes its next sibling (last rank + 1) and its first child (rank 0
appended, while d < K); B pops or an empty heap end it. O(B log B).

Order, ties included: prefixes compare by (-score, depth, ranks), i.e. higher score first, then
shallower, then lexicographically smaller ranks. Because log-probs are <= 0 and each row is
non-increasing, a prefix never precedes the one that pushes it (its parent if its last rank is 0,
else its previous sibling), so the pops are exactly the first B prefixes in this total order, in
that order, and the set is prefix-closed. Scores are summed root to leaf in the same order
everywhere (here, in DraftTree and in a brute force), so equal prefixes get bit-equal floats.

Optional edge scores (GRAFT's TDES, decoder/graft/edge_scorer.py): with ``edge_scores`` given, a child's
score depends on its parent: edge_scores(d, parent_token, ids[d-1], logps[d-1]) returns the m
candidates' edge log-scores at depth d under that parent (finite, <= 0), and a prefix scores the
sum of its edge scores. The same heap stays exact: each parent's children are pushed in its own
order (by edge score, ties by rank), so "next sibling" is the next in that order, and edge scores
<= 0 keep every child behind its parent. Prefixes are then keyed by candidate indices and compare
by (-score, depth, positions in the parents' orders). Without it nothing changes.

A round's edge scores can also come precomputed and checked as an :class:`EdgeGrid` (what
decoder/graft/edge_scorer.py's ``for_round`` returns): every (parent, child) score of the round and each
parent's children already in that order, looked up by the parent's candidate index, so the heap
does no per-pop scoring, checking or sorting. Both forms build the same tree.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from decoder.core.tree import DraftTree

# (depth d, parent token, candidate ids at d (m,), their log marginals (m,)) -> edge log-scores (m,)
EdgeScoreFn = Callable[[int, int, np.ndarray, np.ndarray], np.ndarray | list[float]]


@dataclass(frozen=True)
class EdgeGrid:
    """One round's edge scores, precomputed: ``rows[d - 1][i][c]`` is candidate c's edge log-score
    at depth d under parent i (the parent's candidate index at depth d - 1; i = 0 is the root at
    depth 1) and ``orders[d - 1][i]`` its children best first (score, ties by rank). Whoever builds
    one checks it: finite scores <= 0, orders consistent with them (edge_scorer.py, for_round)."""

    rows: list[list[list[float]]]
    orders: list[list[list[int]]]


EdgeScores = EdgeScoreFn | EdgeGrid


def check_marginals(ids: np.ndarray, logps: np.ndarray, vocab_size: int | None = None) -> None:
    """Refuse marginals the search cannot be exact on, naming the offending field."""
    if ids.ndim != 2 or ids.shape != logps.shape:
        raise ValueError(f"marginals: ids {ids.shape} and logps {logps.shape} must both be (K, m)")
    if not np.all(np.isfinite(logps)):
        raise ValueError("marginals: logps must be finite")
    if np.any(logps > 0):
        raise ValueError(f"marginals: logps must be log-probabilities (<= 0), max is {logps.max()}")
    if np.any(np.diff(logps, axis=1) > 0):
        raise ValueError("marginals: each row of logps must be non-increasing (best candidate first)")
    if np.any(ids < 0) or (vocab_size is not None and np.any(ids >= vocab_size)):
        raise ValueError(f"marginals: ids must be token ids in [0, {vocab_size or 'vocab'})")
    for d, row in enumerate(ids):
        if len(set(row.tolist())) != len(row):
            raise ValueError(f"marginals: ids row {d} (position {d + 1}) repeats a token")


def best_prefixes(logps: np.ndarray, budget: int) -> list[tuple[tuple[int, ...], float]]:
    """The min(budget, available) best rank prefixes with their scores, in pop (= rank) order."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    k, m = logps.shape
    rows = logps.tolist()  # Python floats: the same additions as DraftTree's path scores
    out: list[tuple[tuple[int, ...], float]] = []
    if k == 0 or m == 0 or budget == 0:
        return out
    # entry: (-score, depth, ranks, parent score); ranks alone break every remaining tie
    heap = [(-rows[0][0], 1, (0,), 0.0)]
    while heap and len(out) < budget:
        neg, depth, ranks, base = heapq.heappop(heap)
        out.append((ranks, -neg))
        last = ranks[-1]
        if last + 1 < m:
            sibling = base + rows[depth - 1][last + 1]
            heapq.heappush(heap, (-sibling, depth, (*ranks[:-1], last + 1), base))
        if depth < k:
            child = -neg + rows[depth][0]
            heapq.heappush(heap, (-child, depth + 1, (*ranks, 0), -neg))
    return out


def _edge_row(edge_scores: EdgeScoreFn, d: int, parent: int, ids: np.ndarray, logps: np.ndarray):
    """(edge scores as Python floats, candidate indices best first) of a parent's children at d."""
    got = edge_scores(d, parent, ids[d - 1], logps[d - 1])
    row = got.tolist() if isinstance(got, np.ndarray) else [float(x) for x in got]
    if len(row) != ids.shape[1] or not all(math.isfinite(x) and x <= 0 for x in row):
        raise ValueError(f"edge_scores at depth {d}: need {ids.shape[1]} finite log-scores <= 0, got {row!r}")
    order = sorted(range(len(row)), key=lambda r: (-row[r], r))
    return row, order


def best_scored_prefixes(
    root_token: int, ids: np.ndarray, logps: np.ndarray, budget: int, edge_scores: EdgeScores
) -> list[tuple[tuple[int, ...], float, float]]:
    """The best `budget` prefixes of candidate indices under parent-aware edge scores, in pop order,
    each with (its score, its own edge score); see the module docstring."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    k, m = ids.shape
    out: list[tuple[tuple[int, ...], float, float]] = []
    if k == 0 or m == 0 or budget == 0:
        return out
    if isinstance(edge_scores, EdgeGrid):
        if len(edge_scores.rows) != k or len(edge_scores.rows[0][0]) != m:
            raise ValueError(
                f"edge grid: {len(edge_scores.rows)} depths of {len(edge_scores.rows[0][0])} "
                f"candidates, the marginals have {k} of {m}"
            )
        grid_rows, grid_orders = edge_scores.rows, edge_scores.orders

        def children(d: int, parent_index: int) -> tuple[list[float], list[int]]:
            return grid_rows[d - 1][parent_index], grid_orders[d - 1][parent_index]
    else:
        fn = edge_scores

        def children(d: int, parent_index: int) -> tuple[list[float], list[int]]:
            parent = int(root_token) if d == 1 else int(ids[d - 2, parent_index])
            return _edge_row(fn, d, parent, ids, logps)

    rows = {(): children(1, 0)}
    first = rows[()][1][0]
    # entry: (-score, depth, positions, candidate indices, parent score)
    heap = [(-rows[()][0][first], 1, (0,), (first,), 0.0)]
    while heap and len(out) < budget:
        neg, depth, pos, cand, base = heapq.heappop(heap)
        row, order = rows[cand[:-1]]
        out.append((cand, -neg, row[cand[-1]]))
        if pos[-1] + 1 < m:
            nxt = order[pos[-1] + 1]
            entry = (-(base + row[nxt]), depth, (*pos[:-1], pos[-1] + 1), (*cand[:-1], nxt), base)
            heapq.heappush(heap, entry)
        if depth < k:
            rows[cand] = child_row, child_order = children(depth + 1, cand[-1])
            c = child_order[0]
            heapq.heappush(heap, (-(-neg + child_row[c]), depth + 1, (*pos, 0), (*cand, c), -neg))
    return out


def build_ddtree(
    root_token: int,
    ids: np.ndarray,
    logps: np.ndarray,
    budget: int,
    vocab_size: int | None = None,
    edge_scores: EdgeScores | None = None,
) -> DraftTree:
    """The DDTree of `budget` nodes under the root (the last committed token), nodes in pop order.

    ids, logps: (K, m) per-position candidates, best first. Node i's edge log-prob is its own
    marginal, so its path score is its prefix score and the verifier and sampler serve it as is.
    With `edge_scores`, node i's edge log-prob is its edge score instead (module docstring).
    """
    ids = np.asarray(ids)
    logps = np.asarray(logps, dtype=np.float64)
    check_marginals(ids, logps, vocab_size)
    tree = DraftTree(root_token)
    node_of: dict[tuple[int, ...], int] = {(): 0}
    if edge_scores is None:
        found = [
            (ranks, float(logps[len(ranks) - 1, ranks[-1]])) for ranks, _ in best_prefixes(logps, budget)
        ]
    else:
        found = [(c, e) for c, _, e in best_scored_prefixes(root_token, ids, logps, budget, edge_scores)]
    for ranks, edge in found:
        d, r = len(ranks) - 1, ranks[-1]
        v, _ = tree.add_child(node_of[ranks[:-1]], int(ids[d, r]), edge)
        node_of[ranks] = v
    return tree
