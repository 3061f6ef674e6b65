"""Verification budgets: the SABA rule, a fitted-curve rule, and accepted length under every budget.

Contract (pure Python/NumPy, no torch):
- A budget B counts verified nodes besides the root, as `TreeConfig.budget` and `DraftTree.prune`.
- SABA (GRAFT, arXiv 2608.20375): gain G_t(B) = a_t B^0.5, cost C_t(B) = B c_verify + c_fixed,
  B_t = argmax over integers 1 <= B <= B_max of G_t / C_t. Over real B > 0 the ratio rises while
  B < c_fixed / c_verify and falls after (its derivative has the sign of c_fixed - B c_verify), so
  the integer argmax is floor or ceil of c_fixed / c_verify, clipped to [1, B_max]; a_t > 0 only
  scales the ratio, so it cancels and the rule is one constant per cost curve. `saba_budget`
  returns that constant in closed form; `saba_ratio` is the objective itself.
- Fitted rule: with E[A](B) the expected accepted drafted tokens under budget B (e.g. from
  `budget_sweep` over replayed rounds) and C(B) a measured round cost, a round commits E[A] + 1
  tokens, so the throughput-optimal budget is argmax (E[A](B) + 1) / C(B) (`best_budget`).
- Per-round rule (`verify_budget`, on when `TreeConfig.verify_ms` is set): after a round's tree is
  built, its own scores estimate the gain, E[A](B) = sum of exp(path score) over the first B nodes
  of prune order (`expected_gains`: a node is accepted with its whole path, and the drafters'
  log-probs stand in for that chance; `round_gain_scale` calibrates them), and the round verifies
  B_t = argmax over B = 0..budget of (1 + E[A](B)) / (round_fixed_ms + verify_ms[B])
  (`round_budget`; B_t = 0 verifies the root alone: one plain target step). Where a 2-token forward
  costs what two 1-token forwards cost (fp32 on a CPU), a round whose drafts are unlikely to be
  accepted then falls back to an autoregressive step instead of paying for a tree.
- `budget_sweep(tree, accepted, b_max)`: from one greedy verification of the full tree (its
  accepted path), the accepted length and verified size under `tree.prune(B)` for every
  B <= b_max. prune keeps the best nodes in one order (score, then shallower, then index); when
  every node's parent precedes it in that order (always so when no edge log-prob is positive,
  since a child then never outscores its parent), prune(B) keeps exactly the first B nodes, a
  node's rank is the smallest budget that keeps it, and the accepted length under B is the
  longest accepted prefix whose prefix-maximum rank is below B: one sort and one pass. Otherwise
  (positive edges: prune skips nodes whose ancestors do not fit, and kept sets need not nest) it
  prunes to every budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoder.core.config import TreeConfig
from decoder.core.tree import ROOT, DraftTree

SABA_BETA = 0.5


def _check_costs(c_verify: float, c_fixed: float, b_max: int) -> None:
    if not (math.isfinite(c_verify) and math.isfinite(c_fixed)) or c_verify < 0 or c_fixed < 0:
        raise ValueError(f"costs must be finite and >= 0, got c_verify={c_verify}, c_fixed={c_fixed}")
    if c_verify == 0 and c_fixed == 0:
        raise ValueError("c_verify and c_fixed are both 0: every budget costs nothing")
    if b_max < 1:
        raise ValueError(f"b_max must be >= 1, got {b_max}")


def saba_ratio(a: float, budget: int, c_verify: float, c_fixed: float) -> float:
    """SABA's objective G/C = a B^0.5 / (B c_verify + c_fixed)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return a * budget**SABA_BETA / (budget * c_verify + c_fixed)


def saba_budget(c_verify: float, c_fixed: float, b_max: int) -> int:
    """The SABA budget for every state: c_fixed / c_verify, rounded to the better neighbouring
    integer (the smaller on a tie), clipped to [1, b_max]. c_verify == 0 (verification is free
    per node): b_max."""
    _check_costs(c_verify, c_fixed, b_max)
    if c_verify == 0:
        return b_max
    star = c_fixed / c_verify
    lo = min(max(math.floor(star), 1), b_max)
    hi = min(max(math.ceil(star), 1), b_max)
    return hi if saba_ratio(1.0, hi, c_verify, c_fixed) > saba_ratio(1.0, lo, c_verify, c_fixed) else lo


def linear_cost(budgets: Sequence[int], costs: Sequence[float]) -> tuple[float, float]:
    """Least-squares (c_verify, c_fixed) of C(B) = B c_verify + c_fixed through measured points,
    both floored at 0 (SABA's cost model of a measured curve)."""
    b = np.asarray(budgets, dtype=float)
    c = np.asarray(costs, dtype=float)
    if b.ndim != 1 or b.shape != c.shape or len(b) < 2 or len(set(b.tolist())) < 2:
        raise ValueError(f"need >= 2 distinct budgets with one cost each, got {b.tolist()} / {c.tolist()}")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"costs must be finite, got {c.tolist()}")
    slope, intercept = np.polyfit(b, c, 1)
    return max(float(slope), 0.0), max(float(intercept), 0.0)


def best_budget(budgets: Sequence[int], expected_accepted: Sequence[float], costs: Sequence[float]) -> int:
    """argmax over the grid of (E[A](B) + 1) / C(B); the smallest budget on a tie.

    budgets strictly increasing and >= 1; expected_accepted >= 0; costs > 0 and non-decreasing in B
    (a measured cost curve: a bigger tree never verifies cheaper)."""
    b = np.asarray(budgets)
    a = np.asarray(expected_accepted, dtype=float)
    c = np.asarray(costs, dtype=float)
    if b.ndim != 1 or len(b) == 0 or a.shape != b.shape or c.shape != b.shape:
        raise ValueError(
            f"budgets, expected_accepted and costs need one entry each, got {a.shape}, {c.shape}"
        )
    if b[0] < 1 or np.any(np.diff(b) <= 0):
        raise ValueError(f"budgets must be >= 1 and strictly increasing, got {b.tolist()}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"expected_accepted must be finite and >= 0, got {a.tolist()}")
    if not np.all(np.isfinite(c)) or np.any(c <= 0) or np.any(np.diff(c) < 0):
        raise ValueError(f"costs must be finite, > 0 and non-decreasing in the budget, got {c.tolist()}")
    return int(b[int(np.argmax((a + 1.0) / c))])


def gain_curve(probs: Sequence[float] | np.ndarray, b_max: int) -> np.ndarray:
    """G[B] for B = 0..b_max: the summed acceptance probabilities of the first B nodes (flat past
    the last of ``probs``)."""
    if b_max < 0:
        raise ValueError(f"b_max must be >= 0, got {b_max}")
    p = np.asarray(probs, dtype=float)[:b_max]
    gains = np.zeros(b_max + 1)
    gains[1 : len(p) + 1] = np.cumsum(p)
    gains[len(p) + 1 :] = gains[len(p)]
    return gains


def expected_gains(tree: DraftTree, b_max: int) -> np.ndarray:
    """G[B] for B = 0..b_max: sum of exp(path score) over the first B nodes of prune order (all of
    them, and G flat, past the live nodes)."""
    if b_max < 0:
        raise ValueError(f"b_max must be >= 0, got {b_max}")
    scores = tree.scores
    return gain_curve(np.exp([scores[v] for v in prune_order(tree)[:b_max]]), b_max)


def round_budget(gains: Sequence[float] | np.ndarray, verify_ms: Sequence[float], fixed_ms: float) -> int:
    """argmax over B = 0..len(gains) - 1 of (1 + gains[B]) / (fixed_ms + verify_ms[B]); the smallest
    B on a tie. verify_ms holds at least len(gains) costs (> 0)."""
    g = np.asarray(gains, dtype=float)
    if len(verify_ms) < len(g):
        raise ValueError(f"need {len(g)} verify costs (B = 0..{len(g) - 1}), got {len(verify_ms)}")
    cost = fixed_ms + np.asarray(verify_ms[: len(g)], dtype=float)
    return int(np.argmax((1.0 + g) / cost))


def verify_budget(tree: DraftTree, cfg: TreeConfig) -> int:
    """The nodes (root excluded) this round verifies: cfg.budget, or with cfg.verify_ms set the
    per-round rule's B_t <= cfg.budget (module docstring)."""
    if not cfg.verify_ms:
        return cfg.budget
    gains = cfg.round_gain_scale * expected_gains(tree, cfg.budget)
    return round_budget(gains, cfg.verify_ms, cfg.round_fixed_ms)


@dataclass(frozen=True)
class BudgetSweep:
    """Index B = 0..b_max: accepted drafted tokens and verified nodes (root excluded) under prune(B)."""

    accepted: np.ndarray
    kept: np.ndarray


def prune_order(tree: DraftTree) -> list[int]:
    """Live non-root nodes in the order `DraftTree.prune` considers them."""
    live = [v for v in tree.live_nodes() if v != ROOT]
    return sorted(live, key=lambda v: (-tree.scores[v], tree.depths[v], v))


def budget_sweep(tree: DraftTree, accepted: Sequence[int], b_max: int) -> BudgetSweep:
    """Accepted length and verified size under tree.prune(B) for B = 0..b_max (module docstring).

    accepted: the full tree's accepted path, root excluded (e.g. `tree.greedy_accept(target_next)`);
    each node must be a live child of the one before it."""
    if b_max < 0:
        raise ValueError(f"b_max must be >= 0, got {b_max}")
    parent = ROOT
    for v in accepted:
        if not 0 < v < len(tree) or not tree.alive[v] or tree.parents[v] != parent:
            raise ValueError(f"accepted path {list(accepted)} is not a live root path (at node {v})")
        parent = v
    order = prune_order(tree)
    rank = {v: i for i, v in enumerate(order)}
    budgets = np.arange(b_max + 1)
    if all(tree.parents[v] == ROOT or rank[tree.parents[v]] < i for i, v in enumerate(order)):
        need = np.maximum.accumulate([rank[v] + 1 for v in accepted]) if accepted else np.zeros(0)
        acc = np.searchsorted(need, budgets, side="right")
        return BudgetSweep(acc.astype(np.int64), np.minimum(budgets, len(order)).astype(np.int64))
    acc, kept = np.zeros(b_max + 1, dtype=np.int64), np.zeros(b_max + 1, dtype=np.int64)
    for b in range(b_max + 1):
        pruned = tree.prune(b)
        keep = set(pruned.source.tolist())
        acc[b] = next((i for i, v in enumerate(accepted) if v not in keep), len(accepted))
        kept[b] = len(pruned.tree) - 1
    return BudgetSweep(acc, kept)
