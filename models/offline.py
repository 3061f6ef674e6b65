"""Offline evaluation of a scheduling policy on the enumerated trajectories (pure Python/NumPy).

A policy is a boolean per canonical state ("invoke the mid drafter now"). Following it from the
empty prefix for k = 1..D reaches one of the 2^D schedules of the report; its realised tokens/s is
read from the trajectories table. The best enumerated schedule is the max over all 2^D.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

StateIndex = Mapping[tuple[str, int, str], int]  # (report_id, step, prefix) -> state_id


def walk(decisions: np.ndarray, index: StateIndex, report: str, depth: int) -> str:
    """The schedule (bits, step 1 first) reached by following per-state decisions."""
    prefix = ""
    for k in range(1, depth + 1):
        prefix += "1" if decisions[index[report, k, prefix]] else "0"
    return prefix


@dataclass(frozen=True)
class PolicyResult:
    schedule: str
    tok_per_s: float


def evaluate(
    policies: Mapping[str, np.ndarray],
    fixed: Mapping[str, str],
    index: StateIndex,
    throughput: Mapping[tuple[str, str], float],
    reports: Sequence[str],
    depth: int,
) -> dict[str, dict[str, PolicyResult]]:
    """report -> policy name -> reached schedule and realised tokens/s; adds 'best' (enumerated max)."""
    out: dict[str, dict[str, PolicyResult]] = {}
    for report in reports:
        row = {}
        scheds = {s: t for (r, s), t in throughput.items() if r == report}
        best = max(scheds, key=lambda s: (scheds[s], s))
        row["best"] = PolicyResult(best, scheds[best])
        for name, decisions in policies.items():
            s = walk(decisions, index, report, depth)
            row[name] = PolicyResult(s, scheds[s])
        for name, s in fixed.items():
            row[name] = PolicyResult(s, scheds[s])
        out[report] = row
    return out


def summary(results: Mapping[str, Mapping[str, PolicyResult]]) -> dict[str, dict[str, float]]:
    """Per policy: mean tokens/s over reports, mean per-report % of best, and % of the best's mean."""
    names = list(next(iter(results.values())))
    best_mean = float(np.mean([r["best"].tok_per_s for r in results.values()]))
    out = {}
    for name in names:
        tps = np.array([r[name].tok_per_s for r in results.values()])
        ratio = np.array([r[name].tok_per_s / r["best"].tok_per_s for r in results.values()])
        out[name] = {
            "mean_tok_per_s": float(tps.mean()),
            "mean_pct_of_best": float(100 * ratio.mean()),
            "pct_of_best_mean": float(100 * tps.mean() / best_mean),
        }
    return out


@dataclass(frozen=True)
class Replay:
    """The enumerated trajectories by report: the state index and each schedule's realised tok/s."""

    index: StateIndex
    by_report: Mapping[str, Mapping[str, float]]  # report -> schedule -> realised tok/s

    @classmethod
    def build(cls, index: StateIndex, throughput: Mapping[tuple[str, str], float]) -> Replay:
        by_report: dict[str, dict[str, float]] = {}
        for (report, sched), tps in throughput.items():
            by_report.setdefault(report, {})[sched] = tps
        return cls(index, by_report)

    def throughput(self) -> dict[tuple[str, str], float]:
        return {(r, s): t for r, scheds in self.by_report.items() for s, t in scheds.items()}


def choose_threshold(scores: np.ndarray, regret: np.ndarray, tolerance_pct: float) -> float:
    """The decision threshold t >= 0 (invoke iff score > t) with the least mean regret per state.

    ``regret`` is each state's realised margin as a share of its best tok/s (invoke minus skip,
    both with the best continuation): a wrong decision there costs |regret|. Every state counts,
    not only those a walk reaches, so the choice does not hang on the few states of a few reports.
    Candidates: 0 and every positive score (each gives a distinct rule); among those within
    ``tolerance_pct`` points of the least mean regret, the largest t: when unsure, skip.
    """
    scores, regret = np.asarray(scores, dtype=np.float64), np.asarray(regret, dtype=np.float64)
    candidates = np.unique(np.concatenate([[0.0], scores[scores > 0]]))
    wrong = (scores[None, :] > candidates[:, None]) != (regret[None, :] > 0)
    cost = 100 * (wrong * np.abs(regret)[None, :]).mean(axis=1)
    return float(candidates[cost <= cost.min() + tolerance_pct].max())


def walked_pct_of_best(decisions: np.ndarray, replay: Replay, reports: Sequence[str], depth: int) -> float:
    """Mean over ``reports`` of the walked schedule's realised tok/s as % of the report's best."""
    pct = []
    for report in reports:
        scheds = replay.by_report[report]
        pct.append(100 * scheds[walk(decisions, replay.index, report, depth)] / max(scheds.values()))
    return float(np.mean(pct))


def choose_threshold_walked(
    scores: np.ndarray, replay: Replay, reports: Sequence[str], depth: int, tolerance_pct: float
) -> float:
    """The threshold t >= 0 (invoke iff score > t) whose walk reaches the best schedules.

    What the offline metric and the decoder pay for is the schedule a walk from the empty prefix
    reaches, not per-state agreement: a state off every walk costs nothing, and the per-state
    mean regret (:func:`choose_threshold`) is flat over a wide range of t, so its "largest t
    within tolerance" slides to all-skip. Here each candidate (0 and every positive score of the
    given reports' states: each gives a distinct walk) is scored by the mean walked % of best over
    ``reports``; among those within ``tolerance_pct`` points of the best, the largest t (when
    unsure, skip). ``scores`` must be finite on every state of ``reports``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    rows = [i for (r, _, _), i in replay.index.items() if r in set(reports)]
    own = scores[rows]
    if not np.isfinite(own).all():
        raise ValueError("choose_threshold_walked: some state of the given reports has no score")
    candidates = np.unique(np.concatenate([[0.0], own[own > 0]]))
    pct = np.array([walked_pct_of_best(scores > t, replay, reports, depth) for t in candidates])
    return float(candidates[pct >= pct.max() - tolerance_pct].max())


# The decision thresholds a pair may take: the student's own plus each offset, in its units (a logit
# of P(invoking pays) for the thresholded student). The evaluate stage's pair check tries them on
# each pair's calibration prompts (in one run, before that check: zoo-chat-m +6.5% over All-Mid at
# offset 0, +19.9% at -0.5; the held-out pair zoo-lw +8.4% and +11.5% at +1);
# pair_offset_decisions is their offline, out-of-fold counterpart.
THRESHOLD_OFFSETS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def _walked_pct(decisions: np.ndarray, replay: Replay, report: str, depth: int) -> float:
    scheds = replay.by_report[report]
    return 100 * scheds[walk(decisions, replay.index, report, depth)] / max(scheds.values())


def pair_offset_decisions(
    scores: np.ndarray,
    thresholds: np.ndarray,
    replay: Replay,
    pair_of: Mapping[str, str],
    depth: int,
    offsets: Sequence[float] = THRESHOLD_OFFSETS,
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-pair thresholds, out of fold: each report's states decided by score > own threshold + o,
    o the offset whose walks reach the best schedules (mean walked % of best) over the OTHER reports
    of the report's pair (``pair_of``: report -> pair); among equals the largest (when unsure, skip);
    0 for a pair's only report. ``scores`` and ``thresholds`` are per state (out-of-fold scores and
    each state's fold threshold). Returns the decisions and the offset per report."""
    scores, thresholds = np.asarray(scores, dtype=np.float64), np.asarray(thresholds, dtype=np.float64)
    if 0.0 not in offsets:
        raise ValueError(f"pair_offset_decisions: the offsets {offsets} must include 0")
    reports = sorted(replay.by_report)
    by_offset = {o: scores > thresholds + o for o in offsets}
    pct = {o: {r: _walked_pct(d, replay, r, depth) for r in reports} for o, d in by_offset.items()}
    rows: dict[str, list[int]] = {r: [] for r in reports}
    for (r, _, _), i in replay.index.items():
        rows[r].append(i)
    decisions = np.zeros(len(scores), dtype=bool)
    chosen: dict[str, float] = {}
    for r in reports:
        others = [q for q in reports if q != r and pair_of[q] == pair_of[r]]
        merit = {o: float(np.mean([pct[o][q] for q in others])) if others else 0.0 for o in offsets}
        o = 0.0 if not others else max(offsets, key=lambda o: (merit[o], o))
        chosen[r] = o
        decisions[rows[r]] = by_offset[o][rows[r]]
    return decisions, chosen
