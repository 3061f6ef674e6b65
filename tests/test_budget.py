"""Budgets: SABA's closed form against a brute-force argmax, the fitted-curve rule, and accepted
length under every budget against pruning to each budget and accepting greedily."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.core.budget import best_budget, budget_sweep, linear_cost, saba_budget, saba_ratio
from decoder.core.tree import DraftTree


def brute_saba(a: float, c_verify: float, c_fixed: float, b_max: int) -> tuple[np.ndarray, np.ndarray]:
    """G/C of every integer budget 1..b_max, computed directly (no closed form)."""
    b = np.arange(1, b_max + 1, dtype=float)
    return b, a * np.sqrt(b) / (b * c_verify + c_fixed)


def test_saba_argmax_is_the_cost_ratio_for_every_state():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        c_verify = 10 ** rng.uniform(-3, 1)
        c_fixed = 10 ** rng.uniform(-2, 2)
        b_max = int(rng.integers(1, 200))
        rule = saba_budget(c_verify, c_fixed, b_max)
        star = min(max(c_fixed / c_verify, 1.0), b_max)
        assert abs(rule - star) < 1.0  # a neighbouring integer of the clipped ratio
        for a in 10 ** rng.uniform(-3, 3, size=4):  # a_t > 0: the state's acceptance level
            b, ratio = brute_saba(a, c_verify, c_fixed, b_max)
            best = ratio.max()
            ties = b[ratio >= best * (1 - 1e-12)]  # floor and ceil may tie up to rounding
            assert rule in ties, (c_verify, c_fixed, b_max, a)


def test_saba_rounds_to_the_better_neighbour():
    # c_fixed / c_verify = 2.5: sqrt(2) / 4.5 = 0.3143 < sqrt(3) / 5.5 = 0.3149, so 3, not 2
    assert saba_budget(1.0, 2.5, 63) == 3
    # 28.3: sqrt(28) / 56.3 = 0.093986 > sqrt(29) / 57.3 = 0.093982, so 28
    assert saba_budget(1.0, 28.3, 63) == 28
    assert saba_budget(0.01, 5.0, 63) == 63  # ratio 500, clipped
    assert saba_budget(2.0, 0.1, 63) == 1  # ratio 0.05, clipped
    assert saba_budget(0.0, 1.0, 40) == 40  # free nodes: the ratio rises forever


def test_saba_rejects_bad_costs():
    for args in [(-1.0, 1.0, 8), (1.0, math.nan, 8), (0.0, 0.0, 8), (1.0, 1.0, 0)]:
        with pytest.raises(ValueError):
            saba_budget(*args)
    with pytest.raises(ValueError):
        saba_ratio(1.0, 0, 1.0, 1.0)


def test_linear_cost_recovers_a_line_and_floors_at_zero():
    b = [1, 4, 16, 32, 64]
    cv, cf = linear_cost(b, [0.5 * x + 7.0 for x in b])
    assert cv == pytest.approx(0.5) and cf == pytest.approx(7.0)
    assert linear_cost([1, 2], [3.0, 3.0])[0] == pytest.approx(0.0, abs=1e-12)
    assert linear_cost([1, 2], [1.0, 5.0]) == (pytest.approx(4.0), 0.0)  # intercept -3 floored
    with pytest.raises(ValueError):
        linear_cost([4, 4], [1.0, 2.0])


@given(st.floats(1e-3, 10.0), st.floats(1e-2, 100.0), st.integers(1, 128), st.floats(0.1, 10.0))
def test_fitted_rule_agrees_with_saba_when_the_gain_is_sqrt(c_verify, c_fixed, b_max, a):
    budgets = np.arange(1, b_max + 1)
    gain = a * np.sqrt(budgets)  # E[A] + 1 = a B^0.5, clipped at 0 accepted
    gain = np.maximum(gain, 1.0)
    costs = budgets * c_verify + c_fixed
    choice = best_budget(budgets, gain - 1.0, costs)
    b, ratio = budgets, gain / costs
    assert ratio[choice - 1] == ratio.max()
    if a >= 1.0:  # no clipping at A = 0: the gain is exactly SABA's, so the rules agree
        rule = saba_budget(c_verify, c_fixed, b_max)
        assert ratio[rule - 1] >= ratio.max() * (1 - 1e-12)
        assert b[ratio >= ratio.max() * (1 - 1e-12)].min() <= rule


def test_fitted_rule_on_a_saturating_gain():
    budgets = [1, 2, 4, 8]
    # tokens per round 1.5, 2.0, 2.2, 2.3 over costs 1, 1.2, 1.6, 2.4: 1.5, 1.67, 1.375, 0.96
    assert best_budget(budgets, [0.5, 1.0, 1.2, 1.3], [1.0, 1.2, 1.6, 2.4]) == 2
    assert best_budget(budgets, [0.5, 1.0, 1.2, 1.3], [1.0, 1.0, 1.0, 1.0]) == 8  # free: most tokens
    assert best_budget(budgets, [1.0, 1.0, 1.0, 1.0], [1.0, 1.1, 1.2, 1.3]) == 1  # no gain: smallest
    scaled = best_budget(budgets, [0.5, 1.0, 1.2, 1.3], [1000.0, 1200.0, 1600.0, 2400.0])
    assert scaled == 2  # the unit of the cost curve does not matter


def test_fitted_rule_rejects_bad_curves():
    with pytest.raises(ValueError, match="non-decreasing"):
        best_budget([1, 2, 4], [0.1, 0.2, 0.3], [1.0, 0.9, 1.2])
    with pytest.raises(ValueError, match="strictly increasing"):
        best_budget([1, 4, 2], [0.1, 0.2, 0.3], [1.0, 1.1, 1.2])
    with pytest.raises(ValueError, match="one entry each"):
        best_budget([1, 2], [0.1], [1.0, 1.1])
    with pytest.raises(ValueError, match="expected_accepted"):
        best_budget([1, 2], [-0.1, 0.0], [1.0, 1.1])


@st.composite
def trees_and_targets(draw, positive_edges: bool):
    """A random tree (some subtrees dead) and a target continuation that often follows it."""
    vocab = 3
    tree = DraftTree(draw(st.integers(0, vocab - 1)))
    high = 2.0 if positive_edges else 0.0
    for _ in range(draw(st.integers(0, 70))):
        live = tree.live_nodes()
        parent = live[draw(st.integers(0, len(live) - 1))]
        logp = draw(st.floats(-4.0, high, allow_nan=False))
        tree.add_child(parent, draw(st.integers(0, vocab - 1)), logp)
        if draw(st.integers(0, 30)) == 0:
            tree.remove_children(live[draw(st.integers(0, len(live) - 1))])
    target_next = [draw(st.integers(0, vocab - 1)) for _ in range(len(tree))]
    return tree, target_next


def check_sweep(tree: DraftTree, target_next: list[int]) -> None:
    full = tree.greedy_accept(target_next)
    b_max = tree.n_alive + 2  # past the tree's size too
    sweep = budget_sweep(tree, full, b_max)
    for b in range(b_max + 1):
        pruned = tree.prune(b)
        next_in_pruned = [target_next[v] for v in pruned.source]
        assert sweep.accepted[b] == len(pruned.tree.greedy_accept(next_in_pruned)), b
        assert sweep.kept[b] == len(pruned.tree) - 1, b
    assert sweep.accepted[b_max] == len(full)


@settings(max_examples=300, deadline=None)
@given(trees_and_targets(positive_edges=False))
def test_sweep_matches_pruning_to_every_budget(case):
    check_sweep(*case)


@settings(max_examples=150, deadline=None)
@given(trees_and_targets(positive_edges=True))
def test_sweep_matches_pruning_with_positive_edges(case):
    check_sweep(*case)


def test_sweep_sees_a_deep_accept_cut_by_the_budget():
    # root -> 1 (-0.1) -> 2 (-0.1) -> 3 (-0.1), plus a side branch 4 (-0.05) off the root:
    # prune order 4, 1, 2, 3; the accepted path 1-2-3 needs budgets 2, 3, 4
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 1, -0.1)
    b, _ = tree.add_child(a, 2, -0.1)
    c, _ = tree.add_child(b, 3, -0.1)
    tree.add_child(0, 9, -0.05)
    sweep = budget_sweep(tree, [a, b, c], 6)
    assert sweep.accepted.tolist() == [0, 0, 1, 2, 3, 3, 3]
    assert sweep.kept.tolist() == [0, 1, 2, 3, 4, 4, 4]


def test_sweep_rejects_a_path_that_is_not_the_trees():
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 1, -0.1)
    b, _ = tree.add_child(0, 2, -0.2)
    with pytest.raises(ValueError, match="not a live root path"):
        budget_sweep(tree, [a, b], 4)
    with pytest.raises(ValueError, match="b_max"):
        budget_sweep(tree, [a], -1)
