"""DDTree assembly (decoder/graft/ddtree.py): exact best-first search, checked against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.core.tree import ROOT, DraftTree
from decoder.graft.ddtree import best_prefixes, build_ddtree

# A few distinct log-probs, so that equal scores (ties) are common.
LEVELS = [0.0, -0.25, -0.5, -1.0, -2.0, -3.5]


@st.composite
def marginals(draw, max_k: int = 4, max_m: int = 4, tied: bool = True):
    k = draw(st.integers(1, max_k))
    m = draw(st.integers(1, max_m))
    floats = st.floats(-8.0, 0.0, allow_nan=False, allow_subnormal=False)
    value = st.sampled_from(LEVELS) if tied else floats
    logps = np.array([sorted(draw(st.lists(value, min_size=m, max_size=m)), reverse=True) for _ in range(k)])
    vocab = m + draw(st.integers(0, 5))
    ids = np.array([draw(st.permutations(range(vocab)))[:m] for _ in range(k)], dtype=np.int64)
    return ids, logps


def brute_force(logps: np.ndarray) -> list[tuple[float, int, tuple[int, ...]]]:
    """Every rank prefix with its score, sorted by the documented order (-score, depth, ranks)."""
    k, m = logps.shape
    rows = logps.tolist()
    out = []
    for d in range(1, k + 1):
        for ranks in itertools.product(range(m), repeat=d):
            score = 0.0
            for depth, r in enumerate(ranks):
                score = score + rows[depth][r]
            out.append((score, d, ranks))
    out.sort(key=lambda e: (-e[0], e[1], e[2]))
    return out


def rank_paths(tree: DraftTree, ids: np.ndarray) -> list[tuple[int, ...]]:
    """Each node's prefix of ranks, read back from its path's tokens."""
    paths = [()]
    for v in range(1, len(tree)):
        ranks = tuple(int(np.flatnonzero(ids[d] == t)[0]) for d, t in enumerate(tree.path_tokens(v)))
        paths.append(ranks)
    return paths


@settings(max_examples=300, deadline=None)
@given(marginals(), st.integers(0, 400))
def test_pops_are_the_top_b_prefixes_in_order(marg, budget):
    _, logps = marg
    popped = best_prefixes(logps, budget)
    expect = brute_force(logps)[:budget]
    assert [r for r, _ in popped] == [e[2] for e in expect]
    assert [s for _, s in popped] == [e[0] for e in expect]
    scores = [s for _, s in popped]
    assert all(a >= b for a, b in itertools.pairwise(scores)), "pop order must be non-increasing in score"


@settings(max_examples=200, deadline=None)
@given(marginals(tied=False), st.integers(1, 200))
def test_node_scores_are_the_best_b_without_ties(marg, budget):
    """Tie-break free: the multiset of node scores is the B largest of all prefix scores."""
    ids, logps = marg
    tree = build_ddtree(7, ids, logps, budget)
    everything = sorted((e[0] for e in brute_force(logps)), reverse=True)
    assert sorted(tree.scores[1:], reverse=True) == everything[:budget]


@settings(max_examples=300, deadline=None)
@given(marginals(), st.integers(0, 400), st.integers(0, 50))
def test_tree_is_prefix_closed_and_sized(marg, budget, root):
    ids, logps = marg
    k, m = ids.shape
    available = sum(m**d for d in range(1, k + 1))
    tree = build_ddtree(root, ids, logps, budget)
    assert tree.tokens[ROOT] == root
    assert len(tree) - 1 == min(budget, available)
    paths = rank_paths(tree, ids)
    assert set(paths[1:]) == {e[2] for e in brute_force(logps)[:budget]}
    assert len(set(paths)) == len(paths)
    for v in range(1, len(tree)):
        p = tree.parents[v]
        assert p < v and paths[p] == paths[v][:-1], "every node's parent is its prefix, popped earlier"
        d, r = len(paths[v]) - 1, paths[v][-1]
        assert tree.tokens[v] == ids[d, r] and tree.depths[v] == d + 1
        assert tree.edge_logp[v] == logps[d, r]
    assert max(tree.depths) <= k


def test_greedy_walk_follows_the_tokens_of_the_marginals():
    """The verifier's acceptance over a DDTree: a target that agrees with ranks (0, 1, 0) accepts 3."""
    ids = np.array([[4, 5], [6, 7], [8, 9]])
    logps = np.log(np.array([[0.6, 0.4], [0.5, 0.5], [0.9, 0.1]]))
    tree = build_ddtree(1, ids, logps, 14)
    nxt = {(): 4, (4,): 7, (4, 7): 8, (4, 7, 8): 3}
    target_next = [nxt.get(tuple(tree.path_tokens(v)), 0) for v in range(len(tree))]
    assert tree.path_tokens(tree.greedy_accept(target_next)[-1]) == [4, 7, 8]


@pytest.mark.parametrize(
    ("ids", "logps", "field"),
    [
        ([[1, 2]], [[-1.0, -0.5]], "non-increasing"),
        ([[1, 2]], [[0.5, -0.5]], "<= 0"),
        ([[1, 1]], [[-0.1, -0.5]], "repeats a token"),
        ([[1, 2]], [[-0.1, float("nan")]], "finite"),
        ([[1, 2]], [[-0.1]], "(K, m)"),
        ([[-1, 2]], [[-0.1, -0.5]], "token ids in"),
        ([[1, 12]], [[-0.1, -0.5]], "token ids in"),
    ],
)
def test_bad_marginals_are_refused(ids, logps, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        build_ddtree(0, np.array(ids), np.array(logps), 5, vocab_size=12)


def test_negative_budget_is_refused():
    with pytest.raises(ValueError, match="budget"):
        best_prefixes(np.zeros((2, 2)), -1)
