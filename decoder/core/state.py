"""The online state a scheduler sees before drafting step k (paper section 5.3), pure Python.

The one definition of the state's feature order (:func:`state_feature_names`): the decoder
computes it online, the collectors record it, the learning stages train on it.

- context (4): log1p(prompt tokens), target verify ms, mid call ms, ln(target ms / mid ms)
- history (7): k/D, the n-gram lookahead (below), one bit per step j < D "mid was called at
  step j" (D = 5), log1p(the mid drafter's lag: committed tokens a call now would have to catch up).
  The design's (#mid calls so far)/D is the sum of the bits / D at every decision (step D's bit is
  never set before step D), so its slot holds the lookahead instead:
  ngram_match_frac = the mean over the frontier of n / max_n, n the length of the longest
  n-gram match a small step would draft from there (decoder.core.ngram.NgramDrafter.match_length; 0:
  it would draft nothing). The tree signals are constant before step 1 (a bare root), so without
  it the first decision of a round sees only the context and the lag; with it, whether the text
  is repeating itself where the round starts (code, copied spans), where the free drafter does well.
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

from decoder.core.policies import BuildState, RuntimeContext
from decoder.core.tree import top_w

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


LOOKAHEAD_NAME = "ngram_match_frac"
# what the collectors record before each step: the candidate tree signals, then the lookahead
RECORDED_NAMES = (*SIGNAL_NAMES, LOOKAHEAD_NAME)


def history_names(depth: int) -> tuple[str, ...]:
    """k/D, the n-gram lookahead, a bit per step before the last (step D's bit is 0 at every
    decision), and the mid drafter's lag: log1p(committed tokens its cache lacks), what a call now
    must catch up."""
    return ("step_frac", LOOKAHEAD_NAME, *(f"called_step_{j}" for j in range(1, depth)), "log_mid_lag")


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


def history_features(
    step: int, depth: int, history: Sequence[bool], mid_lag: int, lookahead: float
) -> tuple[float, ...]:
    """k/D, the lookahead (:func:`step_signals`' last value), D - 1 bits (bits for steps >= k are
    0) and log1p(lag).

    ``mid_lag``: committed tokens the mid drafter's cache lacked at the round's start (the whole
    context if it has never run). A mid call earlier in this round caught it up, so then it is 0.
    """
    bits = [float(b) for b in history[: depth - 1]] + [0.0] * (depth - 1 - min(len(history), depth - 1))
    lag = 0 if any(history) else mid_lag
    return (step / depth, float(lookahead), *bits, math.log1p(lag))


def tree_signals(state: BuildState, width: int) -> tuple[float, ...]:
    """The 10 candidate signals, in SIGNAL_NAMES order."""
    return step_signals(state, width)[: len(SIGNAL_NAMES)]


def step_signals(state: BuildState, width: int) -> tuple[float, ...]:
    """What the collectors record and the runtime reads before a step, in RECORDED_NAMES order: the
    10 candidate tree signals, then the n-gram lookahead over the same frontier."""
    tree = state.tree
    alive = tree.alive
    frontier = top_w(tree, [v for v in state.newest if alive[v]], width)
    return (*_candidates(state, width, frontier), _lookahead(state, frontier))


def _lookahead(state: BuildState, frontier: Sequence[int]) -> float:
    """Mean over the frontier of the longest n-gram match a small step would draft from / max_n."""
    ngram = state.ngram
    if ngram is None or not frontier:
        return 0.0
    n_max, tree = ngram.max_n, state.tree
    total = 0
    for v in frontier:
        suffix = (*state.tail, *tree.path_tokens(v))[-n_max:]
        total += ngram.match_length(suffix)
    return total / (len(frontier) * n_max)


def _candidates(state: BuildState, width: int, frontier: Sequence[int]) -> tuple[float, ...]:
    tree = state.tree
    alive = tree.alive
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
