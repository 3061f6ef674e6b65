"""The exported student's round gates, chosen out of fold on the decision-priced round walk.

:class:`Gate` (``skip_rest_below`` g with its ``skip_rest_max_target_ms`` cap T: a score below
threshold - g skips the rest of the round, in pairs whose target_ms is at most T) is chosen by
:func:`choose_skip_rest`; the cross-round backoff (``skip_rounds_max`` c, ``skip_rounds_margin`` h)
by :func:`choose_skip_rounds` after it; :func:`round_policy` makes both choices for an out-of-fold
fit and walks the result per report. The best gate is taken unless deciding every step leads it
by more than one standard error over the reports (models.round_walks.paired_lead); the backoff's
ties go to the larger cap: when unsure, skip.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from features.round_states import backoff_walk_pct, priced_walk_pct_by_report
from models.cross_fit import CrossFit
from models.round_walks import RoundSet, oof_walk_states, paired_lead, walks_by_report

GATE_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class Gate:
    """The student's skip-the-rest gate: ``below`` g (None: decide every step) and
    ``max_target_ms`` T (None: at any runtime target_ms)."""

    below: float | None = None
    max_target_ms: float | None = None

    def __post_init__(self) -> None:
        if self.below is None and self.max_target_ms is not None:
            raise ValueError(f"a gate's target_ms cap ({self.max_target_ms}) needs a gate below")
        if self.below is not None and not (math.isfinite(self.below) and self.below >= 0):
            raise ValueError(f"a gate's g must be finite and >= 0, got {self.below}")
        cap = self.max_target_ms
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"a gate's target_ms cap must be finite and > 0, got {self.max_target_ms}")

    def manifest_fields(self) -> dict[str, float]:
        """What the exported manifest carries for it (decoder.deploy.scheduler.LearnedScheduler
        reads them)."""
        fields = {} if self.below is None else {"skip_rest_below": self.below}
        if self.max_target_ms is not None:
            fields["skip_rest_max_target_ms"] = self.max_target_ms
        return fields

    def rule_text(self) -> str:
        """Its part of the manifest's ``decision`` sentence ("" for no gate)."""
        if self.below is None:
            return ""
        return "; below threshold - skip_rest_below, skip the rest of the round" + (
            "" if self.max_target_ms is None else " (where target_ms <= skip_rest_max_target_ms)"
        )

    @property
    def key(self) -> str:
        """Its name among the walks in metrics.json (after ``student_skip_rest_below_``)."""
        if self.below is None:
            return "none"
        return f"{self.below:.4f}" + (
            "" if self.max_target_ms is None else f"_upto_{self.max_target_ms:.3f}ms"
        )


def choose_skip_rest(
    states: pl.DataFrame, rs: RoundSet, depth: int
) -> tuple[Gate, dict[str, float], dict[str, float]]:
    """The exported student's gate: a score below threshold - g skips the rest of the round without
    deciding, in pairs whose runtime target_ms is at most T. Candidates for g: quantiles of how far
    below its threshold a skipping state's out-of-fold score lies; for T: the geometric midpoints
    between the reports' distinct target_ms (the gate then applies to the cheaper pairs only), and
    no limit. Each (g, T) is scored per report by the decision-priced walk over the round-table
    starts (features.round_states.priced_walk_pct_by_report: the student pays for the decisions it
    takes, a fixed schedule for none): the walk with g where the report's target_ms <= T, the walk
    deciding every step elsewhere. The best (highest mean over reports; ties to the larger g, then
    the smaller T: the fewer walks it changes) is taken unless deciding every step leads it by more
    than one standard error of their paired per-report difference: when the walks cannot tell them
    apart, skip (the issue's decision rule).

    Why T: the gate saves decisions (0.03 ms each here), worth 2-6% of a round on a pair whose
    verify takes 1 ms and nothing on one whose verify takes 40 ms, where a skipped step that would
    have called the mid drafter costs a lot. One run's gate (no T) walked 4-8 points better on
    zoo-s's reports, 0-3 on zoo-m's and up to 9.5 worse on zoo-l's, zoo-chat-m's and zoo-chat-l's;
    priced on zoo-l's held-back gsm8k and humaneval prompts the student was 10-14% faster
    without it. ``states``: models.round_walks.oof_walk_states of the exported student. Returns the gate,
    every candidate's mean % and the noise test (none's lead over the best gate, its standard
    error, the reports)."""
    gates = sorted(_gap_quantiles(states), reverse=True)
    per = {g: priced_walk_pct_by_report(rs.outcomes, states, depth, g) for g in [None, *gates]}
    reports = per[None]["report_id"].to_list()
    if any(v["report_id"].to_list() != reports for v in per.values()):
        raise ValueError("gate walks: the candidates' walks reach different reports")
    pct = {g: v["pct"].to_numpy() for g, v in per.items()}
    if not gates:
        return (
            Gate(),
            {"none": float(pct[None].mean())},
            {"none_lead": 0.0, "none_lead_se": 0.0, "reports": len(reports)},
        )
    cost = _report_target_ms(states, reports)
    by_gate = {Gate(): pct[None]}
    for g in gates:  # the larger g first, then the smaller T, as max keeps the first of equals
        for cap in [*_target_ms_caps(cost), None]:
            by_gate[Gate(g, cap)] = pct[g] if cap is None else np.where(cost <= cap, pct[g], pct[None])
    walks = {gate.key: float(v.mean()) for gate, v in by_gate.items()}
    best = max((gate for gate in by_gate if gate.below is not None), key=lambda gate: walks[gate.key])
    lead, se = paired_lead(by_gate[Gate()], by_gate[best])
    noise = {"none_lead": lead, "none_lead_se": se, "reports": len(reports)}
    return (Gate() if lead > se else best), walks, noise


def _report_target_ms(states: pl.DataFrame, reports: list[str]) -> np.ndarray:
    """Each report's runtime target_ms (the round states' context column), in ``reports`` order."""
    per = states.group_by("report_id").agg(lo=pl.col("target_ms").min(), hi=pl.col("target_ms").max())
    if (per["lo"] != per["hi"]).any():
        raise ValueError("round states: a report holds more than one target_ms")
    by_report = dict(zip(per["report_id"].to_list(), per["lo"].to_list(), strict=True))
    missing = [r for r in reports if r not in by_report]
    if missing:
        raise ValueError(f"round states: no target_ms for reports {missing[:3]}")
    return np.array([by_report[r] for r in reports], dtype=float)


def _target_ms_caps(cost: np.ndarray) -> list[float]:
    """The geometric midpoints between consecutive distinct per-report target_ms, ascending."""
    levels = sorted({float(c) for c in cost})
    return [math.sqrt(a * b) for a, b in itertools.pairwise(levels) if a > 0]


def _gap_quantiles(states: pl.DataFrame) -> list[float]:
    """The distinct :data:`GATE_QUANTILES` of how far below its threshold a skipping state's
    out-of-fold score lies (none when no state skips)."""
    scores, thresholds = states["score"].to_numpy(), states["threshold"].to_numpy()
    gap = (thresholds - scores)[scores <= thresholds]
    return sorted({float(g) for g in np.quantile(gap, GATE_QUANTILES)}) if gap.size else []


BACKOFF_CAPS = (0, 1, 3, 7, 15)


def choose_skip_rounds(
    states: pl.DataFrame, rs: RoundSet, depth: int, gate: Gate
) -> tuple[int, float, dict[str, float]]:
    """The exported student's cross-round backoff: ``skip_rounds_max`` c (after k idle deciding
    rounds in a row, skip the next min(2^k - 1, c) rounds without deciding) and ``skip_rounds_margin``
    h (a round is idle only if none of its decided scores came above threshold - h; h = 0: no mid
    call), chosen together after g (the gate ``skip_rest_below`` already chosen, which every
    candidate keeps). Candidates: c in :data:`BACKOFF_CAPS` x h in 0 and the gap quantiles
    choose_skip_rest draws g from (c = 0 needs no h), each scored out of fold by the
    decision-priced walk with the backoff carried from start to start
    (features.round_states.backoff_walk_pct, which counts skip-runs in round-table starts); the
    best mean wins, ties to the larger c, then the smaller h. A tie is a walk that cannot tell the
    caps apart: a prompt's walk is a few round-table starts long, too short for a run past the
    smaller cap to show, and when unsure the student skips (the issue's decision rule; the
    previous run tied c = 7 and c = 15 to the last digit). ``states``: as for choose_skip_rest.
    Returns c, h and every candidate's %."""
    margins = [0.0, *(h for h in _gap_quantiles(states) if h > 0)]
    candidates = [(0, 0.0), *((c, h) for c in BACKOFF_CAPS if c > 0 for h in margins)]
    pct = {
        ch: backoff_walk_pct(rs.outcomes, states, depth, gate.below, *ch, max_target_ms=gate.max_target_ms)
        for ch in candidates
    }
    c, h = max(candidates, key=lambda ch: (pct[ch], ch[0], -ch[1]))
    return c, h, {backoff_key(*ch): v for ch, v in pct.items()}


BACKOFF_KEY = "student_skip_rounds_max_"


def backoff_key(c: int, h: float) -> str:
    """metrics.json's name of the backoff walk with cap c and idle margin h."""
    return f"{BACKOFF_KEY}{c}" + ("" if c == 0 else f"_margin_{h:.4f}")


def parse_backoff_key(name: str) -> tuple[int, float] | None:
    """(c, h) of a :func:`backoff_key` name (h to its 4 decimals); None for any other walk's name."""
    if not name.startswith(BACKOFF_KEY):
        return None
    cap, _, margin = name.removeprefix(BACKOFF_KEY).partition("_margin_")
    return int(cap), float(margin or 0.0)


@dataclass(frozen=True)
class RoundPolicy:
    """The exported student's round rules with the walks that chose them (the defaults: decide every
    step of every round, as without round states)."""

    gate: Gate = Gate()
    gate_walks: dict[str, float] = field(default_factory=dict)  # gate key -> mean walk %
    gate_noise: dict[str, float] = field(default_factory=dict)  # choose_skip_rest's noise test
    skip_rounds: int = 0
    idle_margin: float = 0.0
    backoff_walks: dict[str, float] = field(default_factory=dict)  # backoff_key -> walk %
    by_report: list[dict] = field(default_factory=list)  # models.round_walks.walks_by_report

    def manifest_fields(self) -> dict[str, float]:
        """What the exported manifest carries for the gate and the backoff."""
        return {
            **self.gate.manifest_fields(),
            **({} if self.skip_rounds == 0 else {"skip_rounds_max": self.skip_rounds}),
            **(
                {}
                if self.skip_rounds == 0 or self.idle_margin == 0
                else {"skip_rounds_margin": self.idle_margin}
            ),
        }

    def rule_text(self) -> str:
        """Its part of the manifest's ``decision`` sentence."""
        return self.gate.rule_text() + (
            ""
            if self.skip_rounds == 0
            else "; after k idle rounds in a row (no decided margin above threshold - "
            "skip_rounds_margin), skip the next min(2^k - 1, skip_rounds_max) rounds without deciding"
        )


def round_policy(oof: CrossFit, rs: RoundSet, depth: int, fold_signals: list[tuple[str, ...]]) -> RoundPolicy:
    """The gate, then the backoff, chosen on ``oof``'s out-of-fold round walk, and the result's walk
    per report beside the fixed schedules'."""
    states = oof_walk_states(oof, rs, depth, fold_signals)
    gate, gate_walks, gate_noise = choose_skip_rest(states, rs, depth)
    skip_rounds, idle_margin, backoff_walks = choose_skip_rounds(states, rs, depth, gate)
    by_report = walks_by_report(states, rs, depth, gate.below, gate.max_target_ms, skip_rounds, idle_margin)
    return RoundPolicy(gate, gate_walks, gate_noise, skip_rounds, idle_margin, backoff_walks, by_report)
