"""Recursive rejection sampling over sibling candidates preserves the target distribution."""

from __future__ import annotations

import numpy as np
import pytest

from decoder.core.sampling import accept_among, sample_walk
from decoder.core.tree import DraftTree


def chi2_pvalue_ok(counts: np.ndarray, probs: np.ndarray, n: int) -> bool:
    """Pearson chi-square against probs; True unless the fit is rejected at the 0.1% level."""
    from math import erf, sqrt

    keep = probs * n >= 5
    expected = probs[keep] * n
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(expected, probs[~keep].sum() * n)
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / sqrt(2 / (9 * dof))  # Wilson-Hilferty
    return 0.5 * (1 + erf(-z / sqrt(2))) > 1e-3


@pytest.mark.parametrize("candidates", [[], [2], [2, 0, 5], [7, 6, 5, 4, 3, 2, 1]])
def test_accept_among_matches_target(candidates):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(8, 0.7))
    n = 20000
    counts = np.zeros(8)
    for _ in range(n):
        tok, idx = accept_among(p, candidates, rng)
        counts[tok] += 1
        assert idx is None or candidates[idx] == tok
    assert chi2_pvalue_ok(counts, p, n)


def test_chi2_helper_rejects_a_wrong_distribution():
    rng = np.random.default_rng(1)
    p = np.full(8, 1 / 8)
    q = rng.dirichlet(np.ones(8))
    counts = np.bincount(rng.choice(8, size=20000, p=q), minlength=8).astype(float)
    assert not chi2_pvalue_ok(counts, p, 20000)


def test_tree_walk_two_token_joint_matches_target():
    rng = np.random.default_rng(2)
    V = 5
    first = rng.dirichlet(np.ones(V))
    second = rng.dirichlet(np.ones(V), size=V)  # second[t] = p(next | first token t)
    tree = DraftTree(0)
    for t, lp in [(1, -0.5), (3, -1.0)]:
        a, _ = tree.add_child(0, t, lp)
        tree.add_child(a, (t + 1) % V, -0.2)
    node_probs = {0: first}
    for v in range(1, len(tree)):
        node_probs[v] = second[tree.tokens[v]] if tree.depths[v] == 1 else first
    n = 20000
    counts = np.zeros(V * V)
    for _ in range(n):
        acc, bonus = sample_walk(tree, lambda v: node_probs[v], rng)
        seq = [tree.tokens[v] for v in acc] + [bonus]
        counts[seq[0] * V + seq[1] if len(seq) > 1 else 0] += len(seq) > 1
        if len(seq) == 1:  # rejected at the root: draw the second token from the target itself
            counts[seq[0] * V + rng.choice(V, p=second[seq[0]])] += 1
    joint = (first[:, None] * second).ravel()
    assert chi2_pvalue_ok(counts, joint, n)
