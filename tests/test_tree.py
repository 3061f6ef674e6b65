"""Property tests for the pure draft-tree core."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.core.tree import ROOT, DraftTree


@st.composite
def trees(draw, max_nodes: int = 40, vocab: int = 4):
    tree = DraftTree(draw(st.integers(0, vocab - 1)))
    for _ in range(draw(st.integers(0, max_nodes))):
        parent = draw(st.integers(0, len(tree) - 1))
        token = draw(st.integers(0, vocab - 1))
        logp = draw(st.floats(-6.0, 0.0, allow_nan=False))
        tree.add_child(parent, token, logp)
    return tree


def brute_ancestors(tree: DraftTree, v: int) -> set[int]:
    out = {v}
    while tree.parents[v] >= 0:
        v = tree.parents[v]
        out.add(v)
    return out


@given(trees())
def test_mask_is_ancestor_closure(tree):
    mask = tree.ancestor_mask()
    for v in range(len(tree)):
        assert set(np.flatnonzero(mask[v])) == brute_ancestors(tree, v)


@given(trees(), st.integers(0, 5000))
def test_positions_are_prefix_plus_depth(tree, prefix):
    pos = tree.positions(prefix)
    for v in range(len(tree)):
        assert pos[v] == prefix + len(brute_ancestors(tree, v)) - 1


@given(trees())
def test_topological_order_and_unique_children(tree):
    for v in range(1, len(tree)):
        assert tree.parents[v] < v
    for v in range(len(tree)):
        kids = list(tree.children[v].values())
        assert len({tree.tokens[u] for u in kids}) == len(kids)


@given(trees(), st.integers(0, 70))
def test_prune_prefix_closed_within_budget_and_best(tree, budget):
    pruned = tree.prune(budget)
    kept = set(pruned.source.tolist())
    assert ROOT in kept
    assert len(kept) - 1 == min(budget, len(tree) - 1)
    for v in kept - {ROOT}:
        assert tree.parents[v] in kept
    # Edge log-probs are <= 0, so the top nodes by (score, shallower) are already prefix-closed.
    key = {v: (-tree.scores[v], tree.depths[v], v) for v in range(1, len(tree))}
    dropped = set(range(1, len(tree))) - kept
    if dropped and kept - {ROOT}:
        assert max(key[v] for v in kept - {ROOT}) < min(key[v] for v in dropped)
    # The compact tree holds the same token paths with the same scores.
    new = pruned.tree
    for i, v in enumerate(pruned.source.tolist()):
        assert new.path_tokens(i) == tree.path_tokens(v)
        assert np.isclose(new.scores[i], tree.scores[v])


@given(trees(), st.data())
def test_greedy_accept_is_best_prefix_over_all_paths(tree, data):
    target_next = data.draw(st.lists(st.integers(0, 3), min_size=len(tree), max_size=len(tree)))
    accepted = tree.greedy_accept(target_next)
    best = 0
    for path in [*tree.root_to_leaf_paths(), []]:
        n, prev = 0, ROOT
        for v in path:
            if tree.tokens[v] != target_next[prev]:
                break
            n, prev = n + 1, v
        best = max(best, n)
    assert len(accepted) == best
    prev = ROOT
    for v in accepted:
        assert tree.parents[v] == prev and tree.tokens[v] == target_next[prev]
        prev = v


@settings(max_examples=50)
@given(trees(), st.data())
def test_remove_children_kills_whole_subtrees(tree, data):
    parent = data.draw(st.integers(0, len(tree) - 1))
    tree.remove_children(parent)
    for v in range(1, len(tree)):
        under = parent in brute_ancestors(tree, v) and v != parent
        assert tree.alive[v] == (not under)
    assert not tree.children[parent]
    pruned = tree.prune(100)
    assert set(pruned.source.tolist()) == set(tree.live_nodes())


def test_same_token_merges_and_keeps_first_score():
    tree = DraftTree(7)
    a, created = tree.add_child(0, 3, -1.0)
    b, again = tree.add_child(0, 3, -0.1)
    assert created and not again and a == b and tree.scores[a] == -1.0


def test_non_finite_scores_are_refused():
    tree = DraftTree(0)
    for bad in (float("-inf"), float("nan")):
        try:
            tree.add_child(0, 1, bad)
        except ValueError:
            continue
        raise AssertionError("non-finite log-prob accepted")


def test_tree_core_does_not_import_torch():
    modules = (
        "decoder.core.tree, decoder.core.ngram, decoder.core.sampling, decoder.core.state, "
        "decoder.deploy.scheduler, decoder.graft.ddtree"
    )
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
