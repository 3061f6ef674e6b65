"""The student's decision-threshold rules, chosen inside each outer fold's training part.

``distill.threshold_rule``: rounds (:func:`round_chooser`: the round walk over the training
reports' round-table starts, the walk that also chooses the training states), walked
(models.offline.choose_threshold_walked: the walked % of best on the training reports' canonical
states) or state (the mean per-state regret, the earliest rule). Every rule is a
models.cross_fit.Chooser and reads nothing of the held-out fold; "when unsure, skip": t >= 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from config.params import DistillParams
from features.round_states import START, round_walk_pct
from models.cross_fit import Chooser, FittedStudent
from models.offline import Replay, choose_threshold, choose_threshold_walked
from models.round_walks import RoundSet

THRESHOLD_RULES = ("rounds", "walked", "state")
ROUND_THRESHOLD_QUANTILES = tuple(np.linspace(0.05, 0.95, 19))


def canonical_chooser(
    cfg: DistillParams, depth: int, reports: np.ndarray, replay: Replay, regret: np.ndarray
) -> Chooser:
    """The canonical-state threshold rules (walked, state); the rounds rule's fallback where a fit
    has no round states to walk (the leave-one-pair-out student) is walked. ``reports``: each
    canonical state's report id; ``regret``: each state's oracle margin, relative."""
    if cfg.threshold_rule not in THRESHOLD_RULES:
        raise ValueError(
            f"distill.threshold_rule must be one of {THRESHOLD_RULES}, got {cfg.threshold_rule!r}"
        )
    if cfg.threshold_rule == "state":
        return lambda scores, train, models: choose_threshold(
            scores[train], regret[train], cfg.skip_tolerance_pct
        )
    return lambda scores, train, models: choose_threshold_walked(
        scores, replay, sorted(set(reports[train])), depth, cfg.skip_tolerance_pct
    )


def round_chooser(
    rs: RoundSet, round_z: Sequence[np.ndarray], folds: np.ndarray, depth: int, tolerance_pct: float
) -> Chooser:
    """The rounds threshold rule: for outer fold f, each training fold g's round states scored by
    the inner model trained without f and g (``round_z[f]``: the round states' inputs of fold f's
    models), then the threshold t >= 0 whose round walk (features.round_states.round_walk_pct,
    the walk that chooses the training states) over the training reports' round-table starts is
    best; among candidates within ``tolerance_pct`` points of the best, the largest (when unsure,
    skip). Candidates: 0 and the 5%, 10%, ..., 95% quantiles of the positive scores. Nothing of
    fold f is read. ``folds``: the outer fold of each scored (canonical) state."""

    def choose(scores: np.ndarray, train: np.ndarray, models: Mapping[int, FittedStudent]) -> float:
        outer = np.unique(folds[~train])
        if len(outer) != 1:
            raise ValueError(f"round threshold: the held-out states span folds {outer.tolist()}")
        z = round_z[int(outer[0])]
        own = np.isin(rs.folds, list(models))
        if np.isin(rs.folds[~own], outer, invert=True).any():
            raise ValueError("round threshold: a training fold's round states have no inner model")
        round_scores = np.full(len(rs.folds), np.nan)
        for g, model in models.items():
            held = rs.folds == g
            round_scores[held] = model.score(z[held])
        frame = rs.frame.filter(pl.Series(own)).select(*START, "step", "prefix")
        mine = round_scores[own]
        positive = mine[mine > 0]
        candidates = np.unique(
            np.concatenate([[0.0], np.quantile(positive, ROUND_THRESHOLD_QUANTILES) if len(positive) else []])
        )
        pct = np.array(
            [
                round_walk_pct(frame.with_columns(is_invoke=pl.Series(mine > t)), rs.outcomes, depth)
                for t in candidates
            ]
        )
        return float(candidates[pct >= pct.max() - tolerance_pct].max())

    return choose
