"""Lossless acceptance over a draft tree at temperature > 0 (pure NumPy).

Drafted children are deterministic candidates, i.e. point-mass proposals. Recursive rejection
sampling over the siblings then reads: accept candidate c_i with probability p_i(c_i); on rejection
set p_{i+1} = p_i with c_i removed, renormalised; if every candidate is rejected, draw from the last
residual. The emitted token is distributed exactly as p, whatever the candidates were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from decoder.tree import ROOT, DraftTree


def accept_among(
    probs: np.ndarray, candidates: Sequence[int], rng: np.random.Generator
) -> tuple[int, int | None]:
    """Return (token, index of the accepted candidate or None when the token is a residual draw)."""
    p = np.asarray(probs, dtype=np.float64).copy()
    for i, c in enumerate(candidates):
        mass = p.sum()
        if mass <= 0:
            break
        if rng.random() * mass < p[c]:
            return int(c), i
        p[c] = 0.0
    mass = p.sum()
    if mass <= 0:  # every token with mass was a rejected candidate: impossible unless p is degenerate
        raise ValueError("target distribution has no mass outside the rejected candidates")
    return int(rng.choice(len(p), p=p / mass)), None


def sample_walk(
    tree: DraftTree, probs_at: Callable[[int], np.ndarray], rng: np.random.Generator
) -> tuple[list[int], int]:
    """Walk the tree from the root; return (accepted nodes, bonus token)."""
    accepted: list[int] = []
    v = ROOT
    while True:
        kids = [u for u in tree.children[v].values() if tree.alive[u]]
        kids.sort(key=lambda u: -tree.scores[u])
        token, idx = accept_among(probs_at(v), [tree.tokens[u] for u in kids], rng)
        if idx is None:
            return accepted, token
        v = kids[idx]
        accepted.append(v)
