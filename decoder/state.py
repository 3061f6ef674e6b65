"""The online state a scheduler sees before drafting step k (paper section 5.3), pure Python.

The one definition of the state's feature order (:func:`state_feature_names`): the decoder
computes it online, the collectors record it, the learning stages train on it.

- context (4): log1p(prompt tokens), target verify ms, mid call ms, ln(target ms / mid ms)
- history (7): k/D, (#mid calls so far)/D, one bit per step j < D "mid was called at step j"
  (D = 5), log1p(the mid drafter's lag: committed tokens a call now would have to catch up)
- tree signals (10 candidates), measured on the tree before step k:
  the *frontier* is what a small step would expand now (top-W of the newest live nodes by
  stored score); the *preview* is a dry run of what a mid step would pick now without calling the
  mid drafter (top-W of the live nodes it has not visited, by stored score).
    frontier_mean_depth, frontier_leaf_ratio (share without children), frontier_mean_score,
    frontier_size, tree_size (live drafted nodes, root excluded), preview_mean_score,
    preview_overlap_ratio (share of the preview already in the frontier), preview_history_share
    (share of the preview at depths the frontier does not have), preview_depth_delta (mean
    preview depth minus mean frontier depth), preview_collapse_debt = max(0, -preview_depth_delta).
  Means over an empty set are 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from decoder.policies import BuildState, RuntimeContext
from decoder.tree import top_w

CONTEXT_NAMES = ("log_prompt_tokens", "target_ms", "mid_ms", "log_target_mid_ratio")
SIGNAL_NAMES = (
    "frontier_mean_depth",
    "frontier_leaf_ratio",
    "frontier_mean_score",
    "frontier_size",
    "tree_size",
    "preview_mean_score",
    "preview_overlap_ratio",
    "preview_history_share",
    "preview_depth_delta",
    "preview_collapse_debt",
)


def history_names(depth: int) -> tuple[str, ...]:
    """k/D, calls/D, a bit per step before the last (step D's bit is 0 at every decision), and the
    mid drafter's lag: log1p(committed tokens its cache lacks), what a call now must catch up."""
    return ("step_frac", "mid_calls_frac", *(f"called_step_{j}" for j in range(1, depth)), "log_mid_lag")


def state_feature_names(depth: int, signals: Sequence[str] = SIGNAL_NAMES) -> tuple[str, ...]:
    """z's feature order: context, history for D steps, then the given tree signals (default: all)."""
    unknown = [s for s in signals if s not in SIGNAL_NAMES]
    if unknown:
        raise ValueError(f"unknown tree signal(s) {unknown}; known: {SIGNAL_NAMES}")
    return (*CONTEXT_NAMES, *history_names(depth), *signals)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def context_features(runtime: RuntimeContext) -> tuple[float, ...]:
    ratio = (
        math.log(runtime.target_ms / runtime.mid_ms) if runtime.target_ms > 0 and runtime.mid_ms > 0 else 0.0
    )
    return (math.log1p(runtime.prompt_tokens), runtime.target_ms, runtime.mid_ms, ratio)


def history_features(step: int, depth: int, history: Sequence[bool], mid_lag: int) -> tuple[float, ...]:
    """k/D, calls/D, D - 1 bits (bits for steps >= k are 0) and log1p(lag).

    ``mid_lag``: committed tokens the mid drafter's cache lacked at the round's start (the whole
    context if it has never run). A mid call earlier in this round caught it up, so then it is 0.
    """
    bits = [float(b) for b in history[: depth - 1]] + [0.0] * (depth - 1 - min(len(history), depth - 1))
    lag = 0 if any(history) else mid_lag
    return (step / depth, sum(history) / depth, *bits, math.log1p(lag))


def tree_signals(state: BuildState, width: int) -> tuple[float, ...]:
    """The 10 candidate signals, in SIGNAL_NAMES order."""
    tree = state.tree
    alive = tree.alive
    frontier = top_w(tree, [v for v in state.newest if alive[v]], width)
    visited = state.visited
    preview = top_w(tree, [v for v, ok in enumerate(alive) if ok and v not in visited], width)
    f_depth = _mean([tree.depths[v] for v in frontier])
    p_depth = _mean([tree.depths[v] for v in preview])
    f_set = set(frontier)
    f_depths = {tree.depths[v] for v in frontier}
    delta = p_depth - f_depth
    return (
        f_depth,
        _mean([0.0 if tree.children[v] else 1.0 for v in frontier]),
        _mean([tree.scores[v] for v in frontier]),
        float(len(frontier)),
        float(tree.n_alive - 1),
        _mean([tree.scores[v] for v in preview]),
        _mean([1.0 if v in f_set else 0.0 for v in preview]),
        _mean([0.0 if tree.depths[v] in f_depths else 1.0 for v in preview]),
        delta,
        max(0.0, -delta),
    )
