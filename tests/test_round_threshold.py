"""distill's rounds threshold rule: each outer fold's threshold from the round walk of its training
reports, scored by the inner models, never reading the held-out fold."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from models.round_walks import RoundSet
from models.thresholds import round_chooser

N_FOLDS, STARTS = 4, 24


class Column:
    """Stands in for an inner model: the score is the first input."""

    def score(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(z, dtype=np.float64)[:, 0]


def _round_set(rng: np.random.Generator, flip_fold: int | None = None) -> tuple[RoundSet, np.ndarray]:
    """One report per fold, depth 1 (one decision per start): at a start of quality q > 0.5 (0.8 or
    0.9) invoking accepts 4 tokens and skipping 0, below (0.1 or 0.2) the reverse;
    both cost 10 ms. ``flip_fold``: that fold's outcomes reversed and its qualities redrawn."""
    rows, outs, quality = [], [], []
    for f in range(N_FOLDS):
        for start in range(STARTS):
            good, level, redrawn = rng.random() < 0.5, rng.choice([0, 1]), rng.uniform(0.0, 2.0)
            q = (0.8, 0.9)[level] if good else (0.1, 0.2)[level]
            if f == flip_fold:  # the same draws either way: the other folds' starts do not change
                good, q = not good, redrawn
            rows.append((f"r{f}", 0, start, 1, "", f))
            quality.append(q)
            for sid, invoke in ((0, False), (1, True)):
                accepted = 4 if invoke == good else 0
                outs.append((f"r{f}", 0, start, sid, accepted, 10.0, 0.01, 0.02))
    frame = pl.DataFrame(
        rows, schema=["report_id", "prompt_id", "start_position", "step", "prefix", "fold_id"], orient="row"
    )
    outcomes = pl.DataFrame(
        outs,
        schema=["report_id", "prompt_id", "start_position", "schedule_id", "accepted", "round_latency_ms",
                "decision_ms", "decision_cold_ms"],
        orient="row",
    ).with_columns(pl.col("schedule_id").cast(pl.Int16))  # fmt: skip
    folds = frame["fold_id"].to_numpy()
    rs = RoundSet(frame, np.zeros(frame.height), folds, outcomes)
    return rs, np.array(quality)[:, None]


def _threshold(rs: RoundSet, z: np.ndarray, f: int) -> float:
    canonical = np.arange(N_FOLDS)  # one scored state per report, its fold
    choose = round_chooser(rs, [z] * N_FOLDS, canonical, depth=1, tolerance_pct=0.0)
    models = {g: Column() for g in range(N_FOLDS) if g != f}
    return choose(np.zeros(N_FOLDS), canonical != f, models)


def test_the_threshold_separates_the_training_reports_starts_and_ignores_the_held_out_fold():
    rng = np.random.default_rng(4)
    rs, z = _round_set(rng)
    for f in range(N_FOLDS):
        t = _threshold(rs, z, f)
        # every training start decided as its best schedule: t between the two groups' qualities
        assert 0.2 <= t < 0.8, (f, t)
        # fold f reversed and its qualities redrawn: its threshold is the same
        flipped, zf = _round_set(np.random.default_rng(4), flip_fold=f)
        assert _threshold(flipped, zf, f) == t
        # while another fold's, which trains on fold f's starts, moves
        other = (f + 1) % N_FOLDS
        assert _threshold(flipped, zf, other) != _threshold(rs, z, other)


def test_when_invoking_never_pays_the_threshold_is_the_largest_candidate():
    rng = np.random.default_rng(5)
    rs, z = _round_set(rng)
    never = rs.outcomes.with_columns(accepted=pl.when(pl.col("schedule_id") == 0).then(4).otherwise(0))
    rs = RoundSet(rs.frame, rs.margin, rs.folds, never)
    t = _threshold(rs, z, 0)
    assert t >= np.quantile(z[rs.folds != 0, 0], 0.95) - 1e-12  # when unsure, skip: the largest t
    assert t >= 0


def test_a_training_fold_without_an_inner_model_is_refused():
    rs, z = _round_set(np.random.default_rng(6))
    canonical = np.arange(N_FOLDS)
    choose = round_chooser(rs, [z] * N_FOLDS, canonical, depth=1, tolerance_pct=0.0)
    with pytest.raises(ValueError, match="no inner model"):
        choose(np.zeros(N_FOLDS), canonical != 0, {1: Column(), 2: Column()})
