"""distill's offline evaluation: every student's and rule's out-of-fold decisions walked on the
canonical states, and the metrics and manifest fields the stage writes.

Following a policy from the empty prefix reaches a schedule whose realised tokens/s the replay
(models.offline.Replay, built of ``trajectories.parquet``) holds. Rows, all out of fold unless
named otherwise: the students of models.student_selection.fit_students, the per-pair threshold
student, the value planner, the fixed schedules and ``student_in_sample`` (the exported student
on the states it trained on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from config.params import DistillParams
from features.round_states import fixed_schedule_pct, round_walk_pct
from models.cross_fit import CrossFit
from models.gate import RoundPolicy
from models.offline import PolicyResult, Replay, evaluate, pair_offset_decisions, summary
from models.round_walks import RoundSet, lead_over_both, vs_fixed
from models.student_selection import Students, Targets

LABELS = {
    "best": "best enumerated schedule",
    "student_oof": "student (exported training states)",
    "student_pair_threshold_oof": "student, per-pair threshold (offset chosen on the pair's other reports)",
    "student_canonical_oof": "student, canonical states",
    "student_rounds_oof": "student, round-level states",
    "student_both_oof": "student, canonical + round-level states",
    "student_mse_oof": "student, MSE + threshold 0 (the paper's)",
    "student_size0_oof": "student, size 0 (no tree signals)",
    "student_no_lookahead_oof": "student, best training states without the n-gram lookahead",
    "student_lopo": "student, leave-one-pair-out",
    "value_planner_oof": "value planner",
    "all_small": "All-Small",
    "all_mid": "All-Mid",
    "fixed_10101": "10101",
    "student_in_sample": "exported student, in sample",
}

Results = dict[str, dict[str, PolicyResult]]  # report -> policy -> reached schedule and tok/s


@dataclass(frozen=True)
class Offline:
    """Each policy's decision per canonical state and what walking them reaches per report."""

    decisions: dict[str, np.ndarray]
    pair_offsets: dict[str, float]  # report -> the per-pair threshold student's offset
    results: Results


def fixed_schedules(depth: int) -> dict[str, str]:
    return {"all_small": "0" * depth, "all_mid": "1" * depth, "fixed_10101": ("10" * depth)[:depth]}


def offline(
    st: Students,
    value_oof_margin: np.ndarray,
    z: np.ndarray,
    report_folds: np.ndarray,
    replay: Replay,
    pair_of: dict[str, str],
    depth: int,
) -> Offline:
    """Every row of the offline table. ``value_oof_margin``: the value planner's out-of-fold margin
    per state; ``z``: the exported student's inputs; ``report_folds``: each state's outer fold."""
    decisions = {name: fit.decisions for name, fit in st.fits.items()}
    decisions["value_planner_oof"] = value_oof_margin > 0
    decisions["student_in_sample"] = st.final.score(z) > st.threshold
    oof = st.fits["student_oof"]
    decisions["student_pair_threshold_oof"], pair_offsets = pair_offset_decisions(
        oof.scores, np.array(oof.thresholds)[report_folds], replay, pair_of, depth
    )
    results = evaluate(
        decisions, fixed_schedules(depth), replay.index, replay.throughput(), sorted(replay.by_report), depth
    )
    return Offline(decisions, pair_offsets, results)


def vs_endpoint(results: Results) -> dict[str, dict[str, float]]:
    """Per student row: min and mean over reports of tok/s / max(All-Small, All-Mid) - 1, in %."""
    out = {}
    for name in next(iter(results.values())):
        if not name.startswith("student"):
            continue
        gaps = [
            100 * (row[name].tok_per_s / max(row["all_small"].tok_per_s, row["all_mid"].tok_per_s) - 1)
            for row in results.values()
        ]
        out[name] = {
            "min_pct": float(min(gaps)),
            "mean_pct": float(np.mean(gaps)),
            "n_below_minus_1pct": int(sum(g < -1 for g in gaps)),
        }
    return out


def state_regret(decisions: dict[str, np.ndarray], regret: np.ndarray) -> dict[str, float]:
    """Per rule, the mean over every state of what its decision there loses (% of best tok/s)."""
    rules = {
        **decisions,
        "always_skip": np.zeros(len(regret), bool),
        "always_invoke": np.ones(len(regret), bool),
    }
    return {n: float(100 * np.mean(np.abs(regret) * (d != (regret > 0)))) for n, d in rules.items()}


def units(loss: str, relative: bool) -> str:
    base = "relative (margin / best realised tok/s)" if relative else "tok_per_s"
    if loss == "weighted_logistic":
        return f"logit of P(invoking pays); trained on sign(margin), weighted by |margin| ({base})"
    return base


def train_set_metrics(st: Students, results: Results, rs: RoundSet | None, depth: int) -> dict:
    """Which training states won and by how much (out of fold): walked % of best on canonical
    states, and with round states each set's walk over the round-table starts (% of round best),
    the MSE student's included; the round walk decides where it exists."""
    summ = summary(results)
    name = {n: (f"student_{n}_oof" if f"student_{n}_oof" in summ else "student_oof") for n in st.by_set}
    pct = {n: summ[name[n]]["mean_pct_of_best"] for n in st.by_set}
    walks = {}
    if rs is not None:
        walks = {n: float(v.mean()) for n, v in st.walks.items()}
        always = rs.frame.with_columns(pl.lit(False).alias("is_invoke"))
        walks["all_small"] = round_walk_pct(always, rs.outcomes, depth)
    by = "rounds" if rs is not None else "canonical"
    merit = {n: walks[n] for n in st.by_set} if by == "rounds" else pct
    ranked = sorted(merit.values(), reverse=True)
    out = {
        "winner": st.train_set,
        "exported_loss": st.loss,
        "selected_by": by,
        "oof_pct_of_best": pct,
        "fold_thresholds": {n: list(f.thresholds) for n, f in st.by_set.items()},
        "oof_invoke_share": {n: float(np.mean(f.decisions)) for n, f in st.by_set.items()},
        "margin_over_runner_up_pct": float(ranked[0] - ranked[1]) if len(ranked) > 1 else None,
        "n_round_states": 0 if rs is None else rs.frame.height,
    }
    if walks:
        out["round_walk_pct_of_oracle"] = walks
        lead, se = lead_over_both(st.best_walk, st.walks)
        out["best_walk"] = st.best_walk
        out["best_lead_over_both_pct"], out["best_lead_over_both_se"] = lead, se
        if st.mse_lead is not None:
            out["mse_lead_vs"], out["mse_lead_pct"], out["mse_lead_se"] = st.mse_lead
        if st.lookahead_lead is not None:
            out["lookahead_lead_vs"], out["lookahead_lead_pct"], out["lookahead_lead_se"] = st.lookahead_lead
            out["no_lookahead_oof_pct_of_best"] = summ["student_no_lookahead_oof"]["mean_pct_of_best"]
    return out


def distill_metrics(
    cfg: DistillParams,
    st: Students,
    tg: Targets,
    regret: np.ndarray,
    off: Offline,
    rs: RoundSet | None,
    depth: int,
    policy: RoundPolicy,
) -> dict:
    """metrics.json of the stage (the exported manifest carries it too), less the counts."""
    oof: CrossFit = st.fits["student_oof"]
    return {
        "loss": st.loss,
        "loss_param": cfg.loss,
        "threshold": st.threshold,
        "fold_thresholds": {n: list(f.thresholds) for n, f in st.fits.items()},
        "oof_invoke_share": float(np.mean(oof.decisions)),
        "pair_threshold_offsets": off.pair_offsets,
        "oof_decision_accuracy_vs_target": float(np.mean(oof.decisions == (tg.final > 0))),
        "oof_decision_accuracy_vs_oracle": float(np.mean(oof.decisions == (tg.oracle > 0))),
        "state_regret_pct": state_regret(off.decisions, regret),
        "offline": summary(off.results),
        "vs_better_endpoint": vs_endpoint(off.results),
        "train_set": train_set_metrics(st, off.results, rs, depth),
        "skip_rest_below": policy.gate.below,
        "skip_rest_max_target_ms": policy.gate.max_target_ms,
        "skip_rest_noise": policy.gate_noise,
        "skip_rounds_max": policy.skip_rounds,
        "skip_rounds_margin": policy.idle_margin,
        "round_walk_by_report": policy.by_report,
        "round_walk_vs_fixed": vs_fixed(policy.by_report),
        "decision_priced_walk_pct": (
            {
                **{f"student_skip_rest_below_{g}": v for g, v in policy.gate_walks.items()},
                **policy.backoff_walks,
                "all_small": fixed_schedule_pct(rs.outcomes, depth, 0),
            }
            if rs is not None
            else {}
        ),
    }


def manifest_fields(cfg: DistillParams, st: Students, policy: RoundPolicy, signals: tuple[str, ...]) -> dict:
    """The exported student's decision rule as its manifest states it (decoder.deploy.scheduler reads it)."""
    return {
        "signals": list(signals),
        "threshold": st.threshold,
        **policy.manifest_fields(),
        "margin_source": cfg.margin_source,
        "margin_units": units(st.loss, cfg.relative),
        "decision": f"invoke the mid drafter iff the de-standardized output > threshold ({st.loss})"
        + policy.rule_text(),
    }
