"""DVC stage ``distill``: the student MLP on z alone learns the invoke/skip margin; offline table.

Targets: ``distill.margin_source`` value (the paper: value-system margins) or oracle; with
``distill.relative`` the margin is divided by the state's best realised tokens/s (a positive
per-state scale, so signs are kept and fast and slow reports weigh alike). Objective
``distill.loss`` (models/student.py) and a decision threshold chosen inside each outer fold's
training part (models/cross_fit.py; "when unsure, skip": t >= 0) by ``distill.threshold_rule``:
rounds (:func:`round_chooser`: the round walk over the training reports' round-table starts, the
walk that also chooses the training states; walked for the leave-one-pair-out student), walked
(models.offline.choose_threshold_walked: the walked % of best on the training reports' canonical
states) or state (the mean per-state regret, the earliest rule). Out of fold, the student for held-out fold f
uses the signal subset chosen without fold f and margins from the value model that did not see
fold f either, so nothing of fold f leaks.

Training states (``distill.train_set``): canonical (trajectory means, targets as above), rounds
(features/round_states.py: one state per round-table start and prefix, the round's own signals,
the prompt's own length; targets: the round's realised margin of invoking against skipping now,
each then followed by the report's best fixed continuation, relative as above; epochs scaled to
the canonical set's optimizer steps) or both stacked. Every set is scored
on the canonical states with the same outer folds; ``auto`` fits all three and exports the one
with the best out-of-fold walk over the round-table starts (without round states: the walked % of
best on canonical states; ties: the earlier of canonical, rounds, both), unless "both" walks
within one standard error of it over the reports: then "both", the set holding every state of the
other two. The offline table says which won and by how much, with each set's walks.

Offline rows (all out of fold unless named otherwise): the student (the exported training
states); with ``auto`` each set's student; the paper's MSE student with threshold 0; a size-0
student (context + history only); a leave-one-pair-out student (its targets are the oracle margins
of the other pairs' trajectories: no value model is fitted without each pair); the value planner;
the fixed schedules; ``student_in_sample`` (the exported student on the states it trained on).
Following a policy from the empty prefix reaches a schedule whose realised tokens/s is read from
``trajectories.parquet``. Writes ``distill.out_dir/`` student.{json,safetensors} (the manifest
carries ``threshold``: invoke iff output > threshold; with round states also, where they pay in the
decision-priced round walk, ``skip_rest_below`` with ``skip_rest_max_target_ms`` and
``skip_rounds_max``: :func:`choose_skip_rest`, which takes a gate unless deciding every step leads
it by more than one standard error over the reports, and :func:`choose_skip_rounds`), offline.csv,
offline.md, curves.csv and metrics.json.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlflow
import numpy as np
import polars as pl
import pyarrow as pa

from collectors.plots import new_figure
from config.params import Params, resolve
from decoder.scheduler import build_manifest, write_artifact
from decoder.state import LOOKAHEAD_NAME, state_feature_names
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.datasets import column, state_matrix
from features.folds import fold_rows
from features.round_states import (
    START,
    backoff_walk_pct,
    backoff_walk_pct_by_report,
    feature_matrix,
    fixed_schedule_pct,
    fixed_schedules_pct_by_report,
    priced_walk_pct_by_report,
    report_context,
    round_outcomes,
    round_states,
    round_walk_pct,
    round_walk_pct_by_report,
)
from features.schemas import margins_spec, states_spec
from features.tables import read_table
from models.cross_fit import (
    Chooser,
    CrossFit,
    FittedStudent,
    FoldInputs,
    StudentSpec,
    TrainRows,
    cross_fit,
    fit_student,
    scaled_epochs,
)
from models.mlp import count_parameters, mlp_arrays
from models.offline import (
    PolicyResult,
    Replay,
    choose_threshold,
    choose_threshold_walked,
    evaluate,
    pair_offset_decisions,
    summary,
    walked_pct_of_best,
)
from models.student import HEAD, LOSSES, student_param_count
from models.training import Curve
from pipeline.cli import run_stage
from pipeline.select_signals import read_fold_signals, read_signals
from pipeline.tracking import (
    file_sha256,
    git_revision,
    log_figure,
    log_metrics,
    stage_run,
    write_csv,
    write_json,
)

log = logging.getLogger(__name__)
FIXED = ("all_small", "all_mid", "fixed_10101")
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


@dataclass(frozen=True)
class Targets:
    final: np.ndarray  # margin per state for the all-reports student
    by_fold: np.ndarray  # (n_states, n_folds): margin from the value model without fold f
    oracle: np.ndarray  # realised margin (same units), for sign accuracy


def targets(margins: pa.Table, source: str, relative: bool) -> Targets:
    if source not in ("value", "oracle"):
        raise ValueError(f"distill.margin_source must be 'value' or 'oracle', got {source!r}")
    oracle = column(margins, "margin_oracle_tok_per_s").astype(float)
    by_fold = np.array(margins.column("margin_value_by_fold_tok_per_s").to_pylist(), dtype=float)
    if source == "value":
        final = column(margins, "margin_value_tok_per_s").astype(float)
    else:
        final, by_fold = oracle, np.repeat(oracle[:, None], by_fold.shape[1], axis=1)
    scale = (
        np.maximum(column(margins, "oracle_invoke_tok_per_s"), column(margins, "oracle_skip_tok_per_s"))
        if relative
        else np.ones(len(final))
    )
    return Targets(final / scale, by_fold / scale[:, None], oracle / scale)


def _replay(states: pa.Table, trajectories: pa.Table) -> Replay:
    keys = zip(column(states, "report_id"), column(states, "step"), column(states, "prefix"), strict=True)
    index = {(r, int(k), p): i for i, (r, k, p) in enumerate(keys)}
    tp = trajectories.select(["report_id", "schedule", "throughput_tok_per_s"]).to_pydict()
    throughput = {(r, s): t for r, s, t in zip(*tp.values(), strict=True)}
    return Replay.build(index, throughput)


TRAIN_SETS = ("canonical", "rounds", "both")
LOSS_CHOICES = ("auto", *LOSSES)


@dataclass(frozen=True)
class Students:
    fits: dict[str, CrossFit]  # out-of-fold rows
    final: FittedStudent
    threshold: float  # of the exported student: the median of the outer folds' nested thresholds
    train_set: str  # the exported student's training states
    by_set: dict[str, CrossFit]  # train set -> its out-of-fold fit (student_oof is the exported one's)
    loss: str  # the exported student's loss (distill.loss, or auto's choice)
    # with round states: each train set's and the MSE student's out-of-fold round walk per report
    # (:func:`_round_walk_by_report`); empty without
    walks: dict[str, np.ndarray]
    # with round walks: the thresholded winner and the MSE student's lead over it (mean, standard
    # error over reports), what loss auto's choice tests; None without
    mse_lead: tuple[str, float, float] | None = None
    # the training set with the best out-of-fold walk, before the noise test that may export "both"
    best_walk: str = ""
    # with round walks: the thresholded winner's walk less the same set's without the n-gram
    # lookahead (mean, standard error over reports); None without
    lookahead_lead: tuple[str, float, float] | None = None


@dataclass(frozen=True)
class RoundSet:
    """The round-level training states (features/round_states.py) and their targets."""

    frame: pl.DataFrame
    margin: np.ndarray  # relative or tok/s, as distill.relative says for the canonical targets
    folds: np.ndarray
    outcomes: pl.DataFrame  # per (start, schedule): accepted, priced ms, decision ms

    def z(self, depth: int, signals: tuple[str, ...]) -> np.ndarray:
        return feature_matrix(self.frame, state_feature_names(depth, signals))


def read_round_set(params: Params, states: pa.Table) -> RoundSet:
    depth = params.tree.depth
    rounds = read_table(resolve(params.collect.out_dir) / "rounds.parquet", rounds_spec(depth))
    actions = read_table(resolve(params.collect.out_dir) / "actions.parquet", actions_spec(depth))
    frame = round_states(rounds, report_context(actions, states), depth)
    margin = frame["margin_suffix_relative" if params.distill.relative else "margin_suffix_tok_per_s"]
    folds = frame["fold_id"].to_numpy().astype(np.int64)
    return RoundSet(frame, margin.to_numpy().astype(np.float64), folds, round_outcomes(rounds))


def _train_sets(choice: str) -> tuple[str, ...]:
    if choice == "auto":
        return TRAIN_SETS
    if choice not in TRAIN_SETS:
        raise ValueError(f"distill.train_set must be 'auto' or one of {TRAIN_SETS}, got {choice!r}")
    return (choice,)


def _set_inputs(
    name: str,
    z: np.ndarray,
    margin: np.ndarray,
    folds: np.ndarray,
    rs: RoundSet | None,
    zr: np.ndarray | None,
) -> FoldInputs:
    """Scored: the canonical states z; trained on: canonical, round-level or both stacked."""
    if name == "canonical":
        return FoldInputs(z, margin)
    assert rs is not None and zr is not None
    if name == "rounds":
        return FoldInputs(z, margin, TrainRows(zr, rs.margin, rs.folds))
    return FoldInputs(
        z,
        margin,
        TrainRows(np.vstack([z, zr]), np.concatenate([margin, rs.margin]), np.concatenate([folds, rs.folds])),
    )


THRESHOLD_RULES = ("rounds", "walked", "state")


def _chooser(params: Params, states: pa.Table, replay: Replay, regret: np.ndarray) -> Chooser:
    """The canonical-state threshold rules (walked, state); the rounds rule's fallback where a fit
    has no round states to walk (the leave-one-pair-out student) is walked."""
    cfg, depth = params.distill, params.tree.depth
    reports = column(states, "report_id")
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


ROUND_THRESHOLD_QUANTILES = tuple(np.linspace(0.05, 0.95, 19))


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


def _students(
    params: Params, states: pa.Table, tg: Targets, regret: np.ndarray, replay: Replay, rs: RoundSet | None
) -> Students:
    cfg, depth = params.distill, params.tree.depth
    if cfg.loss not in LOSS_CHOICES:
        raise ValueError(f"distill.loss must be one of {LOSS_CHOICES}, got {cfg.loss!r}")
    loss = "weighted_logistic" if cfg.loss == "auto" else cfg.loss
    spec = StudentSpec(loss, cfg.hidden, cfg.train, cfg.skip_tolerance_pct, nested_threshold=True)
    walked_rule = _chooser(params, states, replay, regret)
    by_rounds = cfg.threshold_rule == "rounds"
    if by_rounds and rs is None:
        raise ValueError("distill.threshold_rule rounds walks round states: train_set canonical loads none")

    def z_of(signals: tuple[str, ...]) -> np.ndarray:
        return state_matrix(states, state_feature_names(depth, signals))

    folds = fold_rows(states, "report")
    fold_signals = read_fold_signals(params, "report")

    def choose(round_z: Sequence[np.ndarray]) -> Chooser:
        """The rule for a fit whose fold-f models read ``round_z[f]`` on the round states."""
        if not by_rounds:
            return walked_rule
        assert rs is not None
        return round_chooser(rs, round_z, folds, depth, cfg.skip_tolerance_pct)

    def round_inputs(r: RoundSet | None, signals: Sequence[tuple[str, ...]]) -> list[np.ndarray]:
        return [] if r is None else [r.z(depth, s) for s in signals]

    per_fold = [FoldInputs(z_of(s), tg.by_fold[:, f]) for f, s in enumerate(fold_signals)]
    size0 = [FoldInputs(z_of(()), tg.by_fold[:, f]) for f in range(len(per_fold))]
    round_z = round_inputs(rs, fold_signals)  # fold f's round-state inputs, for training and the rule
    by_set = {}
    for name in _train_sets(cfg.train_set):
        inputs = [
            _set_inputs(name, p.z, p.margin, folds, rs, round_z[f] if round_z else None)
            for f, p in enumerate(per_fold)
        ]
        set_spec = scaled_epochs(spec, len(inputs[0].rows(folds).folds), len(folds))
        by_set[name] = cross_fit(inputs, folds, choose(round_z), set_spec)

    mse_spec = replace(spec, loss="mse", nested_threshold=False)
    mse = cross_fit(per_fold, folds, None, mse_spec)
    walked = {**by_set, "mse": mse}
    walks = {}
    if rs is not None:
        walks = {n: _round_walk_by_report(f, rs, depth, fold_signals) for n, f in walked.items()}

    def merit(name: str) -> float:  # the walk over round starts where round states are loaded
        return float(walks[name].mean()) if walks else _walked(walked[name].decisions, replay, depth)

    best = max(by_set, key=lambda n: (merit(n), -TRAIN_SETS.index(n)))
    winner = _unless_within_noise(best, walks) if walks else best
    # auto: the paper's MSE student (canonical states, threshold 0) is exported when its OOF walk
    # beats the thresholded one's; with round walks, by more than one standard error of their
    # paired per-report difference, as the other choices here: when the walk cannot tell them
    # apart, the thresholded student. One run exported an MSE student that led by 0.5
    # points; it called the mid drafter at 70% of zoo-chat-l humaneval's steps, 20% behind
    # All-Small there. Chosen on the same OOF rows it reports, so optimistic.
    mse_lead = (winner, *_paired_lead(walks["mse"], walks[winner])) if walks else None
    export_mse = cfg.loss == "auto" and (
        mse_lead[1] > mse_lead[2] if mse_lead else merit("mse") > merit(winner)
    )
    fits = {"student_oof": mse if export_mse else by_set[winner]}
    fits.update({f"student_{n}_oof": f for n, f in by_set.items() if len(by_set) > 1 or export_mse})
    fits["student_mse_oof"] = mse
    size0_round = round_inputs(rs, [()]) * len(size0)  # one input matrix: every fold reads no signal
    fits["student_size0_oof"] = cross_fit(size0, folds, choose(size0_round), spec)
    if rs is not None:  # what the lookahead is worth: the winner's training states without it
        flat = replace(rs, frame=rs.frame.with_columns(pl.lit(0.0).alias(LOOKAHEAD_NAME)))
        flat_z = round_inputs(flat, fold_signals)
        blind = [
            _set_inputs(winner, _without_lookahead(p.z, depth, s), p.margin, folds, flat, zr)
            for p, s, zr in zip(per_fold, fold_signals, flat_z, strict=True)
        ]
        blind_spec = scaled_epochs(spec, len(blind[0].rows(folds).folds), len(folds))
        fits["student_no_lookahead_oof"] = cross_fit(blind, folds, choose(flat_z), blind_spec)
        walks["no_lookahead"] = _round_walk_by_report(
            fits["student_no_lookahead_oof"], flat, depth, fold_signals
        )
    lookahead_lead = (winner, *_paired_lead(walks[winner], walks["no_lookahead"])) if walks else None
    pair_signals = _pair_signals(params)
    if pair_signals:
        lopo = [FoldInputs(z_of(s), tg.oracle) for s in pair_signals]
        fits["student_lopo"] = cross_fit(lopo, fold_rows(states, "pair"), walked_rule, spec)
    signals = read_signals(params)
    if export_mse:
        final = fit_student(z_of(signals), tg.final, np.ones(len(folds), dtype=bool), mse_spec)
        return Students(fits, final, 0.0, "canonical", by_set, "mse", walks, mse_lead, best, lookahead_lead)
    final_in = _set_inputs(
        winner, z_of(signals), tg.final, folds, rs, None if rs is None else rs.z(depth, signals)
    )
    rows = final_in.rows(folds)
    final_spec = scaled_epochs(spec, len(rows.folds), len(folds))
    final = fit_student(rows.z, rows.margin, np.ones(len(rows.folds), dtype=bool), final_spec)
    # Each fold's threshold was chosen by the same procedure on 1 - 1/k of the reports: their median
    # is that procedure's choice. Re-choosing on the pooled OOF scores would mix k models' scales
    # (on synthetic data the largest near-best t there was 3x the folds' own).
    threshold = float(np.median(by_set[winner].thresholds))
    return Students(fits, final, threshold, winner, by_set, loss, walks, mse_lead, best, lookahead_lead)


def _without_lookahead(z: np.ndarray, depth: int, signals: tuple[str, ...]) -> np.ndarray:
    """z (columns: state_feature_names(depth, signals)) with the n-gram lookahead set to 0."""
    out = np.array(z, dtype=np.float64)
    out[:, state_feature_names(depth, signals).index(LOOKAHEAD_NAME)] = 0.0
    return out


def _walked(decisions: np.ndarray, replay: Replay, depth: int) -> float:
    return walked_pct_of_best(decisions, replay, sorted(replay.by_report), depth)


def _oof_round_scores(
    fit: CrossFit, rs: RoundSet, depth: int, fold_signals: list[tuple[str, ...]]
) -> tuple[np.ndarray, np.ndarray]:
    """Each round state's score by the outer model of its held-out fold, and that fold's threshold."""
    scores = np.full(rs.frame.height, np.nan)
    for f, (model, signals) in enumerate(zip(fit.models, fold_signals, strict=True)):
        held = rs.folds == f
        scores[held] = model.score(rs.z(depth, signals)[held])
    return scores, np.array(fit.thresholds)[rs.folds]


def _unless_within_noise(winner: str, walks: dict[str, np.ndarray]) -> str:
    """``winner``, unless "both" (every state of the other two sets) walks within one standard error
    of it over the reports (their paired per-report difference, as the gate's test): when the
    walk cannot tell the training sets apart, the larger one. One run picked rounds over both by
    0.13 points of the walk; priced on zoo-chat-m's held-back cells, both then beat it by 5-27%."""
    lead, se = _lead_over_both(winner, walks)
    return winner if lead > se else "both"


def _lead_over_both(best: str, walks: dict[str, np.ndarray]) -> tuple[float, float]:
    """``best``'s round walk less "both"'s, paired per report ((0, 0) for both itself)."""
    if best == "both" or "both" not in walks:
        return 0.0, 0.0
    return _paired_lead(walks[best], walks["both"])


def _paired_lead(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(mean, standard error of the mean) over reports of a - b, both per report in the same order:
    the noise test of the training-state choice and of the gate."""
    lead = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return float(lead.mean()), float(lead.std(ddof=1) / math.sqrt(len(lead))) if len(lead) > 1 else 0.0


def _round_walk_by_report(
    fit: CrossFit, rs: RoundSet, depth: int, fold_signals: list[tuple[str, ...]]
) -> np.ndarray:
    """The out-of-fold fit's outer models on each round-table start of their held-out fold: walk
    the round's states from the empty prefix (decision: score > that fold's threshold); per report
    (sorted by report), the round oracle's ms per token summed over its starts / the reached
    schedules', in % (features.round_states.round_walk_pct_by_report; its mean over reports is the
    round walk the offline table shows)."""
    scores, thresholds = _oof_round_scores(fit, rs, depth, fold_signals)
    frame = rs.frame.with_columns(pl.Series("is_invoke", scores > thresholds))
    return round_walk_pct_by_report(frame, rs.outcomes, depth)["pct"].to_numpy()


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
        """What the exported manifest carries for it (decoder.scheduler.LearnedScheduler reads them)."""
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
    without it. ``states``: :func:`oof_walk_states` of the exported student. Returns the gate,
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
    lead, se = _paired_lead(by_gate[Gate()], by_gate[best])
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


def oof_walk_states(
    fit: CrossFit, rs: RoundSet, depth: int, fold_signals: list[tuple[str, ...]]
) -> pl.DataFrame:
    """The round states' keys and runtime target_ms with each state's out-of-fold score and its
    fold's threshold."""
    scores, thresholds = _oof_round_scores(fit, rs, depth, fold_signals)
    keys = ("report_id", "prompt_id", "start_position", "step", "prefix", "target_ms")
    return rs.frame.select(*keys).with_columns(score=pl.Series(scores), threshold=pl.Series(thresholds))


def walks_by_report(
    states: pl.DataFrame, rs: RoundSet, depth: int, gate: Gate, skip_rounds: int, idle_margin: float
) -> list[dict]:
    """Per report, the exported student's decision-priced round walk out of fold (its gate and
    backoff; :func:`oof_walk_states`) beside All-Small's, All-Mid's and the report's best fixed
    schedule's (chosen in hindsight among all 2^D on the report's own starts), each % of the round
    oracle, and the student's gaps to the better endpoint and to the best fixed schedule in %: what
    "the student beats every fixed schedule" means in the walk."""
    student = backoff_walk_pct_by_report(
        rs.outcomes, states, depth, gate.below, skip_rounds, idle_margin, gate.max_target_ms
    )
    fixed = fixed_schedules_pct_by_report(rs.outcomes, depth)
    if fixed["report_id"].unique().sort().to_list() != student["report_id"].to_list():
        raise ValueError("round walks: the fixed schedules' walks reach other reports than the student's")
    small, mid = "0" * depth, "1" * depth
    ends = fixed.group_by("report_id").agg(
        all_small=pl.col("pct").filter(pl.col("schedule") == small).first(),
        all_mid=pl.col("pct").filter(pl.col("schedule") == mid).first(),
        best_fixed=pl.col("pct").max(),
        best_schedule=pl.col("schedule").sort_by("pct", descending=True).first(),
    )
    rows = (
        student.rename({"pct": "student"})
        .join(ends, on="report_id", how="left")
        .with_columns(
            vs_better_endpoint_pct=100 * (pl.col("student") / pl.max_horizontal("all_small", "all_mid") - 1),
            vs_best_fixed_pct=100 * (pl.col("student") / pl.col("best_fixed") - 1),
        )
        .sort("report_id")
    )
    return rows.to_dicts()


def _vs_fixed(rows: list[dict]) -> dict:
    """The student's walk against the better endpoint and the best fixed schedule, per report in %
    (:func:`walks_by_report`'s gaps): mean, worst and how many reports are within 1% (the issue's
    offline test)."""
    if not rows:
        return {}
    end = np.array([r["vs_better_endpoint_pct"] for r in rows])
    best = np.array([r["vs_best_fixed_pct"] for r in rows])
    return {
        "reports": len(rows),
        "vs_better_endpoint_mean_pct": float(end.mean()),
        "vs_better_endpoint_worst_pct": float(end.min()),
        "within_1pct_of_better_endpoint": int((end >= -1).sum()),
        "vs_best_fixed_mean_pct": float(best.mean()),
        "vs_best_fixed_worst_pct": float(best.min()),
        "within_1pct_of_best_fixed": int((best >= -1).sum()),
    }


def _pair_of(states: pa.Table) -> dict[str, str]:
    """report id -> pair id."""
    reports, pairs = states.column("report_id").to_pylist(), states.column("pair_id").to_pylist()
    return dict(zip(reports, pairs, strict=True))


def _pair_signals(params: Params) -> list[tuple[str, ...]]:
    try:
        return read_fold_signals(params, "pair")
    except KeyError:  # fewer than 3 pairs: select_signals wrote no nested pair split
        return []


def main(params: Params) -> dict:
    depth, cfg = params.tree.depth, params.distill
    out = resolve(cfg.out_dir)
    states = read_table(resolve(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(resolve(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    trajectories = read_table(resolve(params.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    signals = read_signals(params)
    names = state_feature_names(depth, signals)
    z = state_matrix(states, names)
    tg = targets(margins, cfg.margin_source, cfg.relative)
    replay = _replay(states, trajectories)
    rs = read_round_set(params, states) if _train_sets(cfg.train_set) != ("canonical",) else None
    with stage_run("distill", params):
        regret = targets(margins, "oracle", relative=True).oracle
        st = _students(params, states, tg, regret, replay, rs)
        n_params = count_parameters(st.final.module)
        if n_params != student_param_count(z.shape[1], cfg.hidden):
            raise RuntimeError(
                f"student has {n_params} parameters, not {student_param_count(z.shape[1], cfg.hidden)}"
            )
        decisions = {name: fit.decisions for name, fit in st.fits.items()}
        decisions["value_planner_oof"] = column(margins, "margin_value_oof_tok_per_s") > 0
        decisions["student_in_sample"] = st.final.score(z) > st.threshold
        oof = st.fits["student_oof"]
        decisions["student_pair_threshold_oof"], pair_offsets = pair_offset_decisions(
            oof.scores, np.array(oof.thresholds)[fold_rows(states, "report")], replay, _pair_of(states), depth
        )
        results = evaluate(
            decisions, _fixed(depth), replay.index, replay.throughput(), sorted(replay.by_report), depth
        )
        gate, gate_walks, gate_noise, skip_rounds, idle_margin, backoff_walks = Gate(), {}, {}, 0, 0.0, {}
        by_report: list[dict] = []
        if rs is not None:
            fold_signals = read_fold_signals(params, "report")
            walk_states = oof_walk_states(oof, rs, depth, fold_signals)
            gate, gate_walks, gate_noise = choose_skip_rest(walk_states, rs, depth)
            skip_rounds, idle_margin, backoff_walks = choose_skip_rounds(walk_states, rs, depth, gate)
            by_report = walks_by_report(walk_states, rs, depth, gate, skip_rounds, idle_margin)
        metrics = {
            "n_params": n_params,
            "n_states": len(z),
            "loss": st.loss,
            "loss_param": cfg.loss,
            "threshold": st.threshold,
            "fold_thresholds": {n: list(f.thresholds) for n, f in st.fits.items()},
            "oof_invoke_share": float(np.mean(oof.decisions)),
            "pair_threshold_offsets": pair_offsets,
            "oof_decision_accuracy_vs_target": float(np.mean(oof.decisions == (tg.final > 0))),
            "oof_decision_accuracy_vs_oracle": float(np.mean(oof.decisions == (tg.oracle > 0))),
            "state_regret_pct": _state_regret(decisions, regret),
            "offline": summary(results),
            "vs_better_endpoint": _vs_endpoint(results),
            "train_set": _train_set_metrics(st, results, rs, depth),
            "skip_rest_below": gate.below,
            "skip_rest_max_target_ms": gate.max_target_ms,
            "skip_rest_noise": gate_noise,
            "skip_rounds_max": skip_rounds,
            "skip_rounds_margin": idle_margin,
            "round_walk_by_report": by_report,
            "round_walk_vs_fixed": _vs_fixed(by_report),
            "decision_priced_walk_pct": (
                {
                    **{f"student_skip_rest_below_{g}": v for g, v in gate_walks.items()},
                    **backoff_walks,
                    "all_small": fixed_schedule_pct(rs.outcomes, depth, 0),
                }
                if rs is not None
                else {}
            ),
        }
        extra = {
            "signals": list(signals),
            "threshold": st.threshold,
            **gate.manifest_fields(),
            **({} if skip_rounds == 0 else {"skip_rounds_max": skip_rounds}),
            **({} if skip_rounds == 0 or idle_margin == 0 else {"skip_rounds_margin": idle_margin}),
            "margin_source": cfg.margin_source,
            "margin_units": _units(st.loss, cfg.relative),
            "decision": f"invoke the mid drafter iff the de-standardized output > threshold ({st.loss})"
            + gate.rule_text()
            + (
                ""
                if skip_rounds == 0
                else "; after k idle rounds in a row (no decided margin above threshold - "
                "skip_rounds_margin), skip the next min(2^k - 1, skip_rounds_max) rounds without deciding"
            ),
            "training_data_sha256": file_sha256(resolve(params.collect.out_dir) / "actions.parquet"),
            "git_revision": git_revision(),
            "metrics": metrics,
        }
        _save(out, st.final, params, names, extra)
        table = _write_offline(out, results, metrics["train_set"], metrics)
        curves = {f"{n}/{c}": v for n, f in st.fits.items() for c, v in f.curves.items()}
        curves["final"] = st.final.curve
        write_csv(
            out / "curves.csv",
            [
                {"fit": fit, "epoch": e, "train_loss": t}
                for fit, c in curves.items()
                for e, t in zip(c.epochs, c.train_loss, strict=True)
            ],
        )
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        mlflow.log_text(table, "offline.md")
        _plot(results, curves)
    log.info("offline table:\n%s", table)
    return metrics


def _train_set_metrics(
    st: Students, results: dict[str, dict[str, PolicyResult]], rs: RoundSet | None, depth: int
) -> dict:
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
        lead, se = _lead_over_both(st.best_walk, st.walks)
        out["best_walk"] = st.best_walk
        out["best_lead_over_both_pct"], out["best_lead_over_both_se"] = lead, se
        if st.mse_lead is not None:
            out["mse_lead_vs"], out["mse_lead_pct"], out["mse_lead_se"] = st.mse_lead
        if st.lookahead_lead is not None:
            out["lookahead_lead_vs"], out["lookahead_lead_pct"], out["lookahead_lead_se"] = st.lookahead_lead
            out["no_lookahead_oof_pct_of_best"] = summ["student_no_lookahead_oof"]["mean_pct_of_best"]
    return out


def _state_regret(decisions: dict[str, np.ndarray], regret: np.ndarray) -> dict[str, float]:
    """Per rule, the mean over every state of what its decision there loses (% of best tok/s)."""
    rules = {
        **decisions,
        "always_skip": np.zeros(len(regret), bool),
        "always_invoke": np.ones(len(regret), bool),
    }
    return {n: float(100 * np.mean(np.abs(regret) * (d != (regret > 0)))) for n, d in rules.items()}


def _units(loss: str, relative: bool) -> str:
    base = "relative (margin / best realised tok/s)" if relative else "tok_per_s"
    if loss == "weighted_logistic":
        return f"logit of P(invoking pays); trained on sign(margin), weighted by |margin| ({base})"
    return base


def _fixed(depth: int) -> dict[str, str]:
    return {"all_small": "0" * depth, "all_mid": "1" * depth, "fixed_10101": ("10" * depth)[:depth]}


def _vs_endpoint(results: dict[str, dict[str, PolicyResult]]) -> dict[str, dict[str, float]]:
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


def _save(out: Path, student: FittedStudent, params: Params, names: tuple[str, ...], extra: dict) -> None:
    manifest = build_manifest(
        kind="student",
        depth=params.tree.depth,
        width=params.tree.width,
        feature_names=names,
        input_names=names,
        x_mean=student.x_std.mean,
        x_std=student.x_std.std,
        heads={HEAD: student.module.sizes},
        y_mean={HEAD: float(student.y_std.mean[0])},
        y_std={HEAD: float(student.y_std.std[0])},
        **extra,
    )
    write_artifact(out / "student", manifest, mlp_arrays(HEAD, student.module.net))


def _train_set_lines(ts: dict) -> list[str]:
    lines = [
        "",
        f"Training states (out of fold, same folds, chosen by the {ts['selected_by']} walk; exported: "
        f"**{ts['winner']}**, loss {ts['exported_loss']}"
        + (
            f", the best walk ahead of the runner-up by {ts['margin_over_runner_up_pct']:.2f} points"
            if ts["margin_over_runner_up_pct"] is not None
            else ""
        )
        + (
            f"; the best walk, {ts['best_walk']}, leads both by {ts['best_lead_over_both_pct']:+.2f} points, "
            f"one standard error {ts['best_lead_over_both_se']:.2f}: both unless the lead is larger"
            if ts.get("best_walk") not in (None, "both")
            else ""
        )
        + (
            f"; the MSE student leads the thresholded one ({ts.get('mse_lead_vs')}) by "
            f"{ts.get('mse_lead_pct', 0.0):+.2f} points, one "
            f"standard error {ts['mse_lead_se']:.2f}: the MSE student only if the lead is larger"
            if "mse_lead_pct" in ts
            else ""
        )
        + (
            f"; with the n-gram lookahead the {ts['lookahead_lead_vs']} student's round walk leads the same "
            f"set's without it by "
            f"{ts['lookahead_lead_pct']:+.2f} points, one standard error {ts['lookahead_lead_se']:.2f}"
            if "lookahead_lead_pct" in ts
            else ""
        )
        + "):",
        "",
        "| training states | % of best (walked, canonical states) "
        "| % of the round oracle (walked, round starts) | invoke share | fold thresholds |",
        "|---|---|---|---|---|",
    ]
    walks = ts.get("round_walk_pct_of_oracle", {})
    for n, pct in ts["oof_pct_of_best"].items():
        walk = f"{walks[n]:.1f}%" if n in walks else ""
        thr = ", ".join(f"{t:.2f}" for t in ts["fold_thresholds"][n])
        lines.append(f"| {n} | {pct:.1f}% | {walk} | {100 * ts['oof_invoke_share'][n]:.1f}% | {thr} |")
    if "mse" in walks:
        lines.append(f"| MSE + threshold 0, canonical (loss auto's other) | | {walks['mse']:.1f}% | | |")
    if "no_lookahead" in walks:
        lines.append(
            f"| {ts['lookahead_lead_vs']} without the n-gram lookahead (set to 0) | "
            f"{ts['no_lookahead_oof_pct_of_best']:.1f}% | {walks['no_lookahead']:.1f}% | | |"
        )
    if "all_small" in walks:
        lines.append(f"| All-Small (reference) | | {walks['all_small']:.1f}% | 0.0% | |")
    return lines


def _gate_lines(metrics: dict) -> list[str]:
    walks = metrics.get("decision_priced_walk_pct") or {}
    if not walks:
        return []
    g, c = metrics["skip_rest_below"], metrics.get("skip_rounds_max", 0)
    h = metrics.get("skip_rounds_margin", 0.0)
    chosen = "decide every step" if g is None else f"skip the rest of a round below threshold - {g:.4g}"
    cap = metrics.get("skip_rest_max_target_ms")
    if g is not None and cap is not None:
        chosen += f", where the runtime target_ms is at most {cap:.3g}"
    noise = metrics.get("skip_rest_noise") or {}
    if noise.get("reports"):
        chosen += (
            f"; deciding every step leads the best gate by {noise['none_lead']:+.2f} points, one standard "
            f"error {noise['none_lead_se']:.2f} over {noise['reports']} reports: a gate unless the lead "
            f"is larger"
        )
    backoff = (
        "decide every round"
        if c == 0
        else f"after k idle rounds in a row (no decided margin above threshold - {h:.4g}) skip the next "
        f"min(2^k - 1, {c}) rounds"
    )
    lines = [
        "",
        f"Decision-priced round walk (out of fold; the student pays each decision it takes, a fixed "
        f"schedule none; the round oracle's ms per token over the starts / the walk's). "
        f"Exported: **{chosen}**; cross-round "
        f"backoff (skip_rounds_max and skip_rounds_margin, chosen with that gate, skip-runs counted in "
        f"round-table starts): "
        f"**{backoff}**.",
        "",
        "| rule | % of the round oracle |",
        "|---|---|",
    ]
    lines += [f"| {name} | {v:.2f}% |" for name, v in walks.items() if parse_backoff_key(name) is None]
    grid: dict[int, dict[float, float]] = {}
    for name, v in walks.items():
        if (ch := parse_backoff_key(name)) is not None:
            grid.setdefault(ch[0], {})[ch[1]] = v
    margins = sorted({m for row in grid.values() for m in row})
    lines += [
        "",
        "Cross-round backoff, % of the round oracle: cap c (rows) x idle margin h (columns; c = 0 never "
        "skips).",
        "",
        "| c | " + " | ".join(f"h = {m:.3g}" for m in margins) + " |",
        "|---|" + "---|" * len(margins),
    ]
    return lines + [
        f"| {c} | " + " | ".join(f"{row[m]:.2f}%" if m in row else "" for m in margins) + " |"
        for c, row in sorted(grid.items())
    ]


def _by_report_lines(metrics: dict) -> list[str]:
    rows, vs = metrics.get("round_walk_by_report") or [], metrics.get("round_walk_vs_fixed") or {}
    if not rows:
        return []
    n_fixed = 2 ** len(rows[0]["best_schedule"])
    lines = [
        "",
        "Per report, the exported student's decision-priced round walk out of fold (its gate and "
        "backoff) against the fixed schedules, % of the round oracle (best fixed: the report's best of "
        f"all {n_fixed} in hindsight). Against the better endpoint: mean "
        f"{vs['vs_better_endpoint_mean_pct']:+.1f}%, worst {vs['vs_better_endpoint_worst_pct']:+.1f}%, "
        f"within 1% on {vs['within_1pct_of_better_endpoint']} of {vs['reports']} reports; against the "
        f"best fixed schedule: mean {vs['vs_best_fixed_mean_pct']:+.1f}%, worst "
        f"{vs['vs_best_fixed_worst_pct']:+.1f}%, within 1% on {vs['within_1pct_of_best_fixed']}.",
        "",
        "| report | student | All-Small | All-Mid | best fixed (schedule) | vs better endpoint "
        "| vs best fixed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['report_id']} | {r['student']:.1f}% | {r['all_small']:.1f}% | {r['all_mid']:.1f}% | "
            f"{r['best_fixed']:.1f}% ({r['best_schedule']}) | {r['vs_better_endpoint_pct']:+.1f}% | "
            f"{r['vs_best_fixed_pct']:+.1f}% |"
        )
    return lines


def _write_offline(
    out: Path, results: dict[str, dict[str, PolicyResult]], train_set: dict, metrics: dict
) -> str:
    policies = [p for p in LABELS if p in next(iter(results.values()))]
    write_csv(
        out / "offline.csv",
        [{"report_id": r, **{p: row[p].tok_per_s for p in policies}} for r, row in results.items()],
    )
    summ, gaps = summary(results), _vs_endpoint(results)
    lines = [
        "| policy | mean tok/s | % of best (mean of ratios) | worst report vs better endpoint |",
        "|---|---|---|---|",
    ]
    for p in policies:
        gap = f"{gaps[p]['min_pct']:+.1f}%" if p in gaps else ""
        lines.append(
            f"| {LABELS[p]} | {summ[p]['mean_tok_per_s']:.2f} | {summ[p]['mean_pct_of_best']:.1f}% | {gap} |"
        )
    lines += _train_set_lines(train_set)
    lines += _gate_lines(metrics)
    lines += _by_report_lines(metrics)
    lines += ["", "| report | " + " | ".join(LABELS[p] for p in policies) + " |"]
    lines.append("|" + "---|" * (len(policies) + 1))
    for report, row in results.items():
        cells = [f"{row[p].tok_per_s:.2f} ({row[p].schedule})" for p in policies]
        lines.append(f"| {report} | " + " | ".join(cells) + " |")
    text = (
        "\n".join(lines) + "\n\nCells: realised tok/s (reached schedule, step 1 first). Every row except "
        "the last decides each report with models that never saw it (leave-one-pair-out: never saw its "
        "pair); signal subsets and thresholds were chosen without the held-out fold.\n"
    )
    (out / "offline.md").write_text(text)
    return text


def _plot(results: dict, curves: dict[str, Curve]) -> None:
    fig, ax = new_figure(8, 4)
    reports = list(results)
    policies = [p for p in LABELS if p in results[reports[0]] and p != "best"]
    width = 0.8 / len(policies)
    for j, p in enumerate(policies):
        pct = [100 * results[r][p].tok_per_s / results[r]["best"].tok_per_s for r in reports]
        ax.bar(np.arange(len(reports)) + j * width, pct, width, label=LABELS[p])
    ax.set_ylabel("% of best enumerated schedule")
    ax.set_xticks(np.arange(len(reports)) + 0.4, reports, rotation=90, fontsize=6)
    ax.set_ylim(bottom=min(50, ax.get_ylim()[0]))
    ax.legend(fontsize=6, ncol=3)
    log_figure(fig, "offline_pct_of_best.png")
    fig, ax = new_figure()
    for fit, c in curves.items():
        if fit == "final" or fit.startswith("student_oof/"):
            ax.plot(c.epochs, c.train_loss, lw=1, label=fit)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (weighted)")
    ax.legend(fontsize=6)
    log_figure(fig, "learning_curves.png")


if __name__ == "__main__":
    run_stage("distill", main)
