"""Lossless acceptance over a draft tree at temperature > 0 (NumPy only; rows may live anywhere).

Drafted children are deterministic candidates, i.e. point-mass proposals. Recursive rejection
sampling over the siblings then reads: accept candidate c_i with probability p_i(c_i); on rejection
set p_{i+1} = p_i with c_i removed, renormalised; if every candidate is rejected, draw from the last
residual. The emitted token is distributed exactly as p, whatever the candidates were.

A probability row is a NumPy array or any object with the `ProbRow` methods: the walk only ever
asks for the candidates' probabilities and the row's mass (k + 1 numbers) and, for a residual draw,
one inverse-CDF lookup with a host uniform. So a row on an accelerator (decoder/core/device_rows.py)
sends k + 1 numbers and one token id to the host, never the vocabulary. All randomness comes from
one NumPy generator, so a seed fixes the outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from decoder.core.tree import ROOT, DraftTree


class ProbRow(Protocol):
    """One next-token distribution wherever it is stored."""

    def probs_of(self, tokens: Sequence[int]) -> np.ndarray: ...

    def mass(self) -> float: ...

    def inverse_cdf(self, removed: Sequence[int], u: float) -> int:
        """The token at fraction u in [0, 1) of the mass left after zeroing `removed`."""
        ...


class NumpyRow:
    """A ProbRow over a host array."""

    def __init__(self, probs: np.ndarray) -> None:
        self.p = np.asarray(probs, dtype=np.float64)

    def probs_of(self, tokens: Sequence[int]) -> np.ndarray:
        return self.p[list(tokens)]

    def mass(self) -> float:
        return float(self.p.sum())

    def inverse_cdf(self, removed: Sequence[int], u: float) -> int:
        p = self.p.copy()
        p[list(removed)] = 0.0
        cdf = np.cumsum(p)
        if cdf[-1] <= 0:
            raise ValueError("target distribution has no mass outside the rejected candidates")
        return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(p) - 1)


def as_row(probs: np.ndarray | ProbRow) -> ProbRow:
    return NumpyRow(probs) if isinstance(probs, np.ndarray | list | tuple) else probs


def accept_among(
    probs: np.ndarray | ProbRow, candidates: Sequence[int], rng: np.random.Generator
) -> tuple[int, int | None]:
    """Return (token, index of the accepted candidate or None when the token is a residual draw)."""
    row = as_row(probs)
    cands = [int(c) for c in candidates]
    if cands:
        p_c, mass = row.probs_of(cands), row.mass()
        for i, c in enumerate(cands):
            if mass <= 0:
                break
            if rng.random() * mass < p_c[i]:
                return c, i
            mass -= float(p_c[i])
    return row.inverse_cdf(cands, rng.random()), None


def sample_token(probs: np.ndarray | ProbRow, rng: np.random.Generator) -> int:
    """One draw from a probability row."""
    return as_row(probs).inverse_cdf((), rng.random())


def sample_walk(
    tree: DraftTree, probs_at: Callable[[int], np.ndarray | ProbRow], rng: np.random.Generator
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
