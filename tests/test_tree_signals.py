"""The scheduler's state features: definitions checked on hand-built trees."""

from __future__ import annotations

import math

import pytest

from decoder.policies import BuildState, RuntimeContext
from decoder.state import SIGNAL_NAMES, context_features, history_features, tree_signals
from decoder.tree import DraftTree


def test_signals_on_a_hand_built_tree():
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 1, -0.5)  # depth 1
    tree.add_child(0, 2, -1.0)  # b, depth 1
    c, _ = tree.add_child(a, 3, -0.5)  # depth 2, score -1.0
    d, _ = tree.add_child(c, 4, -0.1)  # depth 3, score -1.1
    state = BuildState(tree, visited={0, a}, newest=[c, d], frontier=[])
    sig = dict(zip(SIGNAL_NAMES, tree_signals(state, width=2), strict=True))
    # frontier = top-2 of newest {c: -1.0, d: -1.1} = [c, d]; preview = top-2 of unvisited {b, c, d}
    # by score: b -1.0 (depth 1) ties c -1.0 (depth 2): shallower first -> [b, c]
    assert sig["frontier_size"] == 2 and sig["tree_size"] == 4
    assert sig["frontier_mean_depth"] == 2.5
    assert sig["frontier_leaf_ratio"] == 0.5  # c has a child, d does not
    assert sig["frontier_mean_score"] == pytest.approx(-1.05)
    assert sig["preview_mean_score"] == pytest.approx(-1.0)
    assert sig["preview_overlap_ratio"] == 0.5  # c is in the frontier
    assert sig["preview_history_share"] == 0.5  # b's depth 1 is not a frontier depth
    assert sig["preview_depth_delta"] == pytest.approx(1.5 - 2.5)
    assert sig["preview_collapse_debt"] == pytest.approx(1.0)


def test_signals_before_the_first_step():
    sig = tree_signals(BuildState(DraftTree(7)), width=10)
    assert dict(zip(SIGNAL_NAMES, sig, strict=True)) == {
        "frontier_mean_depth": 0.0, "frontier_leaf_ratio": 1.0, "frontier_mean_score": 0.0,
        "frontier_size": 1.0, "tree_size": 0.0, "preview_mean_score": 0.0, "preview_overlap_ratio": 1.0,
        "preview_history_share": 0.0, "preview_depth_delta": 0.0, "preview_collapse_debt": 0.0,
    }  # fmt: skip


def test_history_and_context_features():
    assert history_features(1, 5, (), 0) == (0.2, 0.0, 0, 0, 0, 0, 0)
    # no call yet this round: the lag at the round's start is what a call now catches up
    assert history_features(3, 5, (False, False), 99) == pytest.approx((0.6, 0.0, 0, 0, 0, 0, math.log(100)))
    # a call at step 1 caught the mid drafter up: no lag afterwards, whatever it was
    assert history_features(4, 5, (True, False, True), 99) == (0.8, 0.4, 1, 0, 1, 0, 0)
    assert len(history_features(5, 5, (True,) * 4, 7)) == 7  # 17 inputs with 6 signals and context
    ctx = context_features(RuntimeContext(prompt_tokens=99, target_ms=20.0, mid_ms=5.0))
    assert ctx == pytest.approx((math.log(100), 20.0, 5.0, math.log(4)))
