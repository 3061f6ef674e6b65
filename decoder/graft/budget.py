"""GRAFT's learned per-round budget for DDTree rounds (pure Python/NumPy, no torch).

SABA's G_t(B) = a_t B^0.5 makes the best budget one constant per cost curve (decoder/core/budget.py).
This rule learns the gain curve instead. A DDTree's nodes are its pops in order, so the tree of
budget B is its first B nodes and the accepted length under B is the number of those nodes on the
target's path (the set is prefix-closed). Hence E[A](B | round) = sum over i <= B of
P(node i is on the target's path), and with a per-node probability the whole curve follows from
one tree:

- Node i's features (``NODE_FEATURES``, :func:`node_features`): its path score (the sum of its
  edges' log-scores: the drafter's marginals, or TDES's edge scores), its depth over K, the round's
  confidence (the drafter's best log-marginal at position 1) and the acceptance history (the
  previous round's accepted drafted tokens over K; 0 in the first round).
- P(node i accepted) = sigmoid(weights . x_i + bias), fitted offline on replayed rounds of the
  collect prompts (models/gain_fit.py); the node labels come from one check of the largest tree.
- The round builds its tree at ``rule.cap`` nodes and verifies its first B_t nodes,
  B_t = argmax over B = 0..cap of 1 + G(B) - rate x cost_ms[B], the smallest on a tie (B_t = 0
  verifies the root alone: one plain target step). cost_ms is the whole round's price at each B
  and rate the tokens per ms decoding sustains, so a node is verified while its chance of
  acceptance pays for its ms at that rate. This, not each round's own ratio (1 + G) / C, maximises
  tokens per ms over a whole output: with total tokens T(policy) and total ms S(policy), the best
  policy's rate r* = T/S is where max over policies of T - r* S = 0, and T - r S is a sum over
  rounds, so each round maximises its own 1 + G - r C (Dinkelbach's method for ratio objectives).
  A per-round ratio stops a confident round early (its ratio is above r*) and lets a weak round
  grow (below r*): the opposite of what pays. The fit (models/budget_rule.py) iterates
  rate <- the walked rate of the rule, Dinkelbach's fixed point, on the collect prompts.

Decoding (decoder/graft/decode.py) and the exact walk of collect and evaluation
(collectors/graft/walk.py) both call :func:`rule_budget`, so they decide alike.
"""

from __future__ import annotations

import numpy as np

from decoder.core.budget import gain_curve
from decoder.core.config import BlockBudgetRule
from decoder.core.tree import DraftTree

NODE_FEATURES = ("path_score", "depth_frac", "first_logp", "prev_accepted_frac")


def node_features(tree: DraftTree, n_nodes: int, first_logp: float, prev_accepted: int, k: int) -> np.ndarray:
    """(min(n_nodes, len(tree) - 1), len(NODE_FEATURES)) features of nodes 1..n_nodes (pop order)."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    n = max(0, min(n_nodes, len(tree) - 1))
    x = np.empty((n, len(NODE_FEATURES)))
    x[:, 0] = tree.scores[1 : n + 1]
    x[:, 1] = np.asarray(tree.depths[1 : n + 1], dtype=float) / k
    x[:, 2] = float(first_logp)
    x[:, 3] = prev_accepted / k
    return x


def node_probs(x: np.ndarray, weights: tuple[float, ...] | np.ndarray, bias: float) -> np.ndarray:
    """sigmoid(x @ weights + bias), computed without overflow."""
    w = np.asarray(weights, dtype=float)
    if x.ndim != 2 or x.shape[1] != len(w):
        raise ValueError(f"node features {x.shape} do not match {len(w)} weights ({NODE_FEATURES})")
    z = x @ w + float(bias)
    return np.exp(-np.logaddexp(0.0, -z))


def rule_gains(
    tree: DraftTree, first_logp: float, prev_accepted: int, k: int, rule: BlockBudgetRule
) -> np.ndarray:
    """G[B] for B = 0..rule.cap: the expected accepted drafted tokens of the first B nodes (flat
    past the tree's last node)."""
    p = node_probs(node_features(tree, rule.cap, first_logp, prev_accepted, k), rule.weights, rule.bias)
    return gain_curve(p, rule.cap)


def rule_budget(tree: DraftTree, first_logp: float, prev_accepted: int, k: int, rule: BlockBudgetRule) -> int:
    """B_t for this round (module docstring); tree holds at least the first rule.cap pops.

    The same objective as 1 + rule_gains - rate x cost_ms, written for the decoding loop: the
    round-constant features fold into one offset and 1 - rate x cost_ms is the rule's
    (BlockBudgetRule.offsets), so a decision is a handful of vector ops on at most cap values."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if len(rule.weights) != len(NODE_FEATURES):
        raise ValueError(
            f"the rule's {len(rule.weights)} weights do not match the node features {NODE_FEATURES}"
        )
    # sigmoid(z) = (1 + tanh(z / 2)) / 2: one ufunc, and no overflow at any z
    w_score, w_depth, w_first, w_prev = rule.weights
    n = max(0, min(rule.cap, len(tree) - 1))
    half_z = np.array(tree.scores[1 : n + 1]) * (0.5 * w_score)
    half_z += np.array(tree.depths[1 : n + 1]) * (0.5 * w_depth / k)
    half_z += 0.5 * (w_first * float(first_logp) + w_prev * (prev_accepted / k) + rule.bias)
    objective = rule.offsets.copy()
    if n:
        p = np.tanh(half_z, out=half_z)
        p += 1.0
        p *= 0.5
        gains = p.cumsum(out=p)
        objective[1 : n + 1] += gains
        objective[n + 1 :] += gains[-1]
    return int(objective.argmax())


def first_nodes(tree: DraftTree, budget: int) -> DraftTree:
    """The tree of a DDTree's first ``budget`` nodes (its pops in order are its nodes in order)."""
    if budget >= len(tree) - 1:
        return tree
    out = DraftTree(tree.tokens[0])
    for v in range(1, budget + 1):
        out.add_child(tree.parents[v], tree.tokens[v], tree.edge_logp[v])
    return out
