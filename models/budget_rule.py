"""GRAFT's learned per-round budget, fitted on the collect prompts' exact walks.

:func:`fit_budget_rule` stacks the node rows of every walker's walk at ``row_budget`` (the pair's
learned fixed B: the rounds the rule will mostly see; collectors/graft/walk.py, node_rows), fits
P(node on the target's path) by logistic regression (models/gain_fit.py), and for each cap in
``caps`` walks every prompt under the rule with that cap and the pair's measured round costs
(collectors/graft/costs.py, rule_costs). The rule's rate (tokens per ms, decoder/graft/budget.py)
starts at the rate of the pair's learned fixed B and follows Dinkelbach's iteration, rate <- the
rate the rule walks at, for at most ``iterations`` steps or until it moves by less than 1e-6 of
itself; the best walked (cap, rate) wins (ties: the smaller cap). Only collect prompts are read;
the held-back prompts of evaluate_graft stay unseen.

:func:`cross_fitted_speedups` compares the two learned budgets out of fold, as a choice between
them must be made: the collect prompts come in groups (one per dataset); each group is priced under
the fixed B (collectors/graft/budget.py, learned_budget) and under the rule, both chosen on the
other groups only, and the pooled speedups over all groups are returned. In sample the fixed B is
the argmax of the very curve it is scored on, so an in-sample comparison favours it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from collectors.graft.budget import (
    learned_budget,
    priced_totals,
    round_price,
    rule_price,
    rule_speedup,
    totals_speedup,
)
from collectors.graft.costs import GraftCosts
from collectors.graft.walk import BudgetWalker
from decoder.core.config import BlockBudgetRule
from decoder.graft.budget import NODE_FEATURES, node_probs
from models.gain_fit import fit_logistic, log_loss


def fit_budget_rule(
    walkers: Sequence[BudgetWalker],
    row_budget: int,
    start_speedup: float,
    costs: GraftCosts,
    tdes: bool,
    caps: Sequence[int],
    l2: float,
    iterations: int = 8,
) -> tuple[BlockBudgetRule, dict]:
    """(the chosen rule, a JSON summary of the fit and of every cap's collect speedup).

    start_speedup: the pooled collect speedup at row_budget, the iteration's starting rate."""
    if not walkers:
        raise ValueError("the budget rule needs at least one walked collect prompt")
    if not caps or min(caps) < 1 or max(caps) > walkers[0].b_max:
        raise ValueError(f"rule caps {list(caps)} must lie in 1..{walkers[0].b_max}")
    if not start_speedup > 0:
        raise ValueError(f"the starting speedup must be > 0, got {start_speedup}")
    rows = [w.node_rows(row_budget) for w in walkers]
    x = np.concatenate([r[0] for r in rows])
    y = np.concatenate([r[1] for r in rows])
    weights, bias = fit_logistic(x, y, l2)
    found: dict[int, tuple[float, float, int]] = {}  # cap -> (speedup, rate, iterations)
    cost_of = {cap: costs.rule_costs(cap, tdes) for cap in sorted(set(caps))}
    for cap, cost in cost_of.items():
        price = functools.partial(rule_price, costs, tdes, cap)
        rate, best = start_speedup / costs.ar_token_ms, (0.0, 0.0, 0)
        for i in range(1, iterations + 1):
            rule = BlockBudgetRule(tuple(weights), bias, cost, rate)
            speedup = rule_speedup(walkers, rule, price, costs.ar_token_ms)
            if speedup > best[0]:
                best = (speedup, rate, i)
            walked = speedup / costs.ar_token_ms
            if abs(walked - rate) < 1e-6 * rate:
                break
            rate = walked
        found[cap] = best
    cap = max(found, key=lambda c: (found[c][0], -c))
    speedup, rate, steps = found[cap]
    p = node_probs(x, weights, bias)
    summary = {
        "cap": cap,
        "rate_tokens_per_ms": rate,
        "iterations": steps,
        "weights": dict(zip(NODE_FEATURES, weights.tolist(), strict=True)),
        "bias": bias,
        "nodes": len(y),
        "accepted_share": float(y.mean()),
        "log_loss_in_sample": log_loss(x, y, weights, bias),
        "expected_over_accepted_in_sample": float(p.sum() / y.sum()),
        "collect_speedup": speedup,
        "collect_speedup_by_cap": {str(c): v[0] for c, v in found.items()},
    }
    return BlockBudgetRule(tuple(weights), bias, cost_of[cap], rate), summary


def cross_fitted_speedups(
    groups: Sequence[Sequence[BudgetWalker]],
    costs: GraftCosts,
    tdes: bool,
    caps: Sequence[int],
    l2: float,
    b_max: int,
) -> tuple[float, float]:
    """(fixed B, per-round rule): the pooled priced speedup over every group's prompts when the
    budget is chosen on the other groups (module docstring). Needs >= 2 groups."""
    if len(groups) < 2 or not all(groups):
        raise ValueError(f"cross-fitting needs >= 2 non-empty groups, got {[len(g) for g in groups]}")

    price = functools.partial(round_price, costs, tdes, False)
    fixed, ruled = [], []
    for i, group in enumerate(groups):
        train = [w for j, g in enumerate(groups) if j != i for w in g]
        budget, curve = learned_budget(train, price, costs.ar_token_ms, b_max)
        rule, _ = fit_budget_rule(train, budget, curve[budget - 1], costs, tdes, caps, l2)
        fixed += [priced_totals(w.fixed(budget), price) for w in group]
        ruled_price = functools.partial(rule_price, costs, tdes, rule.cap)
        ruled += [priced_totals(w.ruled(rule), ruled_price) for w in group]
    return totals_speedup(fixed, costs.ar_token_ms), totals_speedup(ruled, costs.ar_token_ms)
