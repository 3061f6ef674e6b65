"""DDTree assembly: the best draft tree of B nodes from per-position marginals (pure Python/NumPy).

A block drafter gives, for each future position d = 1..K, its top-m tokens and log-probs, best
first (decoder/block.py, `Marginals`). Under the surrogate "the drafter's joint is the product of
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
"""

from __future__ import annotations

import heapq

import numpy as np

from decoder.tree import DraftTree


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


def build_ddtree(
    root_token: int, ids: np.ndarray, logps: np.ndarray, budget: int, vocab_size: int | None = None
) -> DraftTree:
    """The DDTree of `budget` nodes under the root (the last committed token), nodes in pop order.

    ids, logps: (K, m) per-position candidates, best first. Node i's edge log-prob is its own
    marginal, so its path score is its prefix score and the verifier and sampler serve it as is.
    """
    ids = np.asarray(ids)
    logps = np.asarray(logps, dtype=np.float64)
    check_marginals(ids, logps, vocab_size)
    tree = DraftTree(root_token)
    node_of: dict[tuple[int, ...], int] = {(): 0}
    for ranks, _ in best_prefixes(logps, budget):
        d, r = len(ranks) - 1, ranks[-1]
        v, _ = tree.add_child(node_of[ranks[:-1]], int(ids[d, r]), float(logps[d, r]))
        node_of[ranks] = v
    return tree
