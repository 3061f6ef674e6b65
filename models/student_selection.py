"""distill's students: targets, the out-of-fold fits of every training set, and the exported choice.

Targets (:func:`targets`): value-system margins (the paper) or oracle ones, optionally divided by
the state's best realised tokens/s. Training sets: canonical (trajectory means), rounds (the
round-level states, models.round_walks.RoundSet) or both stacked; every set is scored on the
canonical states with the same outer folds (models/cross_fit.py). :func:`fit_students` fits each
set, the paper's MSE student, a size-0 student, one without the n-gram lookahead and a
leave-one-pair-out one, chooses which to export by the out-of-fold walk (over the round-table
starts where round states are loaded, else the walked % of best on the canonical states), with
"both" and the thresholded student kept unless the walk can tell them apart, and fits the
exported student on every report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa
from tqdm import tqdm

from config.params import DistillParams
from decoder.core.state import LOOKAHEAD_NAME, state_feature_names
from features.datasets import column, state_matrix
from features.folds import fold_rows
from models.cross_fit import (
    Chooser,
    CrossFit,
    FittedStudent,
    Fitter,
    FoldInputs,
    StudentSpec,
    TrainRows,
    cross_fit,
    fit_serially,
    fit_student,
    scaled_epochs,
)
from models.offline import Replay, walked_pct_of_best
from models.round_walks import RoundSet, paired_lead, round_walk_by_report, unless_within_noise
from models.student import LOSSES
from models.thresholds import canonical_chooser, round_chooser

TRAIN_SETS = ("canonical", "rounds", "both")
LOSS_CHOICES = ("auto", *LOSSES)


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


def replay_of(states: pa.Table, trajectories: pa.Table) -> Replay:
    """The canonical states' index and the trajectories' realised tokens/s per (report, schedule)."""
    keys = zip(column(states, "report_id"), column(states, "step"), column(states, "prefix"), strict=True)
    index = {(r, int(k), p): i for i, (r, k, p) in enumerate(keys)}
    tp = trajectories.select(["report_id", "schedule", "throughput_tok_per_s"]).to_pydict()
    throughput = {(r, s): t for r, s, t in zip(*tp.values(), strict=True)}
    return Replay.build(index, throughput)


def train_sets(choice: str) -> tuple[str, ...]:
    """The training sets ``distill.train_set`` fits (auto: all three)."""
    if choice == "auto":
        return TRAIN_SETS
    if choice not in TRAIN_SETS:
        raise ValueError(f"distill.train_set must be 'auto' or one of {TRAIN_SETS}, got {choice!r}")
    return (choice,)


@dataclass(frozen=True)
class SignalSets:
    """select_signals' subsets: the exported student's and each outer fold's, chosen without it."""

    chosen: tuple[str, ...]
    by_report_fold: list[tuple[str, ...]]
    by_pair_fold: list[tuple[str, ...]]  # empty with fewer than 3 pairs (no nested pair split)


@dataclass(frozen=True)
class Students:
    fits: dict[str, CrossFit]  # out-of-fold rows
    final: FittedStudent
    threshold: float  # of the exported student: the median of the outer folds' nested thresholds
    train_set: str  # the exported student's training states
    by_set: dict[str, CrossFit]  # train set -> its out-of-fold fit (student_oof is the exported one's)
    loss: str  # the exported student's loss (distill.loss, or auto's choice)
    # with round states: each train set's and the MSE student's out-of-fold round walk per report
    # (models.round_walks.round_walk_by_report); empty without
    walks: dict[str, np.ndarray]
    # with round walks: the thresholded winner and the MSE student's lead over it (mean, standard
    # error over reports), what loss auto's choice tests; None without
    mse_lead: tuple[str, float, float] | None = None
    # the training set with the best out-of-fold walk, before the noise test that may export "both"
    best_walk: str = ""
    # with round walks: the thresholded winner's walk less the same set's without the n-gram
    # lookahead (mean, standard error over reports); None without
    lookahead_lead: tuple[str, float, float] | None = None


def set_inputs(
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


@dataclass(frozen=True)
class _Setup:
    """What every fit of one distill run shares: the states, their folds, the threshold rules and
    the student's training spec."""

    states: pa.Table
    depth: int
    rs: RoundSet | None
    folds: np.ndarray  # outer fold of each canonical state
    fold_signals: list[tuple[str, ...]]
    walked_rule: Chooser  # the canonical-state rule
    by_rounds: bool  # distill.threshold_rule is rounds
    spec: StudentSpec
    fit_all: Fitter  # where the fits run (models.cross_fit: in this process or in workers)

    def z(self, signals: tuple[str, ...]) -> np.ndarray:
        return state_matrix(self.states, state_feature_names(self.depth, signals))

    def choose(self, round_z: Sequence[np.ndarray]) -> Chooser:
        """The rule for a fit whose fold-f models read ``round_z[f]`` on the round states."""
        if not self.by_rounds:
            return self.walked_rule
        assert self.rs is not None
        return round_chooser(self.rs, round_z, self.folds, self.depth, self.spec.tolerance_pct)

    def round_inputs(self, r: RoundSet | None, signals: Sequence[tuple[str, ...]]) -> list[np.ndarray]:
        return [] if r is None else [r.z(self.depth, s) for s in signals]

    def round_walk(self, fit: CrossFit, rs: RoundSet) -> np.ndarray:
        return round_walk_by_report(fit, rs, self.depth, self.fold_signals)


def _setup(
    cfg: DistillParams,
    depth: int,
    states: pa.Table,
    replay: Replay,
    regret: np.ndarray,
    rs: RoundSet | None,
    fold_signals: list[tuple[str, ...]],
    fit_all: Fitter,
) -> _Setup:
    """The shared setup of ``cfg``'s fits; ValueError on a loss or threshold rule it cannot run."""
    if cfg.loss not in LOSS_CHOICES:
        raise ValueError(f"distill.loss must be one of {LOSS_CHOICES}, got {cfg.loss!r}")
    loss = "weighted_logistic" if cfg.loss == "auto" else cfg.loss
    spec = StudentSpec(loss, cfg.hidden, cfg.train, cfg.skip_tolerance_pct, nested_threshold=True)
    walked_rule = canonical_chooser(cfg, depth, column(states, "report_id"), replay, regret)
    by_rounds = cfg.threshold_rule == "rounds"
    if by_rounds and rs is None:
        raise ValueError("distill.threshold_rule rounds walks round states: train_set canonical loads none")
    folds = fold_rows(states, "report")
    return _Setup(states, depth, rs, folds, fold_signals, walked_rule, by_rounds, spec, fit_all)


def without_lookahead(z: np.ndarray, depth: int, signals: tuple[str, ...]) -> np.ndarray:
    """z (columns: state_feature_names(depth, signals)) with the n-gram lookahead set to 0."""
    out = np.array(z, dtype=np.float64)
    out[:, state_feature_names(depth, signals).index(LOOKAHEAD_NAME)] = 0.0
    return out


def _walked(decisions: np.ndarray, replay: Replay, depth: int) -> float:
    return walked_pct_of_best(decisions, replay, sorted(replay.by_report), depth)


def _no_lookahead_fit(su: _Setup, winner: str, per_fold: list[FoldInputs]) -> tuple[CrossFit, np.ndarray]:
    """What the lookahead is worth: the winner's training states without it, and its round walk."""
    assert su.rs is not None
    flat = replace(su.rs, frame=su.rs.frame.with_columns(pl.lit(0.0).alias(LOOKAHEAD_NAME)))
    flat_z = su.round_inputs(flat, su.fold_signals)
    blind = [
        set_inputs(winner, without_lookahead(p.z, su.depth, s), p.margin, su.folds, flat, zr)
        for p, s, zr in zip(per_fold, su.fold_signals, flat_z, strict=True)
    ]
    blind_spec = scaled_epochs(su.spec, len(blind[0].rows(su.folds).folds), len(su.folds))
    fit = cross_fit(blind, su.folds, su.choose(flat_z), blind_spec, su.fit_all)
    return fit, su.round_walk(fit, flat)


def _fit_sets(
    su: _Setup, per_fold: list[FoldInputs], names: tuple[str, ...], bar: tqdm
) -> dict[str, CrossFit]:
    """Each training set's out-of-fold fit, scored on the canonical states ``per_fold`` holds."""
    round_z = su.round_inputs(
        su.rs, su.fold_signals
    )  # fold f's round-state inputs, for training and the rule
    by_set = {}
    for name in names:
        inputs = [
            set_inputs(name, p.z, p.margin, su.folds, su.rs, round_z[f] if round_z else None)
            for f, p in enumerate(per_fold)
        ]
        set_spec = scaled_epochs(su.spec, len(inputs[0].rows(su.folds).folds), len(su.folds))
        by_set[name] = cross_fit(inputs, su.folds, su.choose(round_z), set_spec, su.fit_all)
        bar.update()
    return by_set


@dataclass(frozen=True)
class _Export:
    """Which out-of-fold fit is exported, with the walks' tests behind the choice."""

    winner: str  # the training set, after the noise test that may export "both"
    best: str  # the training set with the best out-of-fold walk
    export_mse: bool  # the paper's MSE student instead of the winner's thresholded one
    mse_lead: tuple[str, float, float] | None  # (winner, MSE's lead over it, standard error)


def _choose_export(
    cfg: DistillParams, fits: dict[str, CrossFit], walks: dict[str, np.ndarray], replay: Replay, depth: int
) -> _Export:
    """The training set and loss to export, from each set's and the MSE student's (``fits["mse"]``)
    out-of-fold walk over the round starts (``walks``), or without round states the walked % of
    best on the canonical states."""

    def merit(name: str) -> float:
        return float(walks[name].mean()) if walks else _walked(fits[name].decisions, replay, depth)

    best = max((n for n in fits if n != "mse"), key=lambda n: (merit(n), -TRAIN_SETS.index(n)))
    winner = unless_within_noise(best, walks) if walks else best
    # auto: the paper's MSE student (canonical states, threshold 0) is exported when its OOF walk
    # beats the thresholded one's; with round walks, by more than one standard error of their
    # paired per-report difference, as the other choices here: when the walk cannot tell them
    # apart, the thresholded student. One run exported an MSE student that led by 0.5
    # points; it called the mid drafter at 70% of zoo-chat-l humaneval's steps, 20% behind
    # All-Small there. Chosen on the same OOF rows it reports, so optimistic.
    mse_lead = (winner, *paired_lead(walks["mse"], walks[winner])) if walks else None
    export_mse = cfg.loss == "auto" and (
        mse_lead[1] > mse_lead[2] if mse_lead else merit("mse") > merit(winner)
    )
    return _Export(winner, best, export_mse, mse_lead)


def _ablation_fits(
    su: _Setup,
    tg: Targets,
    winner: str,
    per_fold: list[FoldInputs],
    by_pair_fold: list[tuple[str, ...]],
    bar: tqdm,
) -> tuple[dict[str, CrossFit], np.ndarray | None]:
    """The size-0 student, the winner's training set without the n-gram lookahead (with round
    states; its round walk returned beside) and the leave-one-pair-out student (with pair folds)."""
    size0 = [FoldInputs(su.z(()), tg.by_fold[:, f]) for f in range(len(per_fold))]
    size0_round = su.round_inputs(su.rs, [()]) * len(size0)  # one input matrix: every fold reads no signal
    fits = {"student_size0_oof": cross_fit(size0, su.folds, su.choose(size0_round), su.spec, su.fit_all)}
    bar.update()
    blind_walk = None
    if su.rs is not None:
        fits["student_no_lookahead_oof"], blind_walk = _no_lookahead_fit(su, winner, per_fold)
        bar.update()
    if by_pair_fold:
        lopo = [FoldInputs(su.z(s), tg.oracle) for s in by_pair_fold]
        by_pair = fold_rows(su.states, "pair")
        fits["student_lopo"] = cross_fit(lopo, by_pair, su.walked_rule, su.spec, su.fit_all)
        bar.update()
    return fits, blind_walk


def fit_students(
    cfg: DistillParams,
    depth: int,
    states: pa.Table,
    tg: Targets,
    regret: np.ndarray,
    replay: Replay,
    rs: RoundSet | None,
    signals: SignalSets,
    fit_all: Fitter = fit_serially,
) -> Students:
    """Every out-of-fold student and the exported one (module docstring); a progress bar on stderr
    counts the cross-fits. ``fit_all``: where the fits run (the students are the same either way)."""
    su = _setup(cfg, depth, states, replay, regret, rs, signals.by_report_fold, fit_all)
    per_fold = [FoldInputs(su.z(s), tg.by_fold[:, f]) for f, s in enumerate(su.fold_signals)]
    names = train_sets(cfg.train_set)
    total = len(names) + 3 + (rs is not None) + bool(signals.by_pair_fold)  # + MSE, size 0, the export
    with tqdm(total=total, desc="distill (student fits)", unit="fit") as bar:
        by_set = _fit_sets(su, per_fold, names, bar)
        mse_spec = replace(su.spec, loss="mse", nested_threshold=False)
        mse = cross_fit(per_fold, su.folds, None, mse_spec, su.fit_all)
        bar.update()
        walked = {**by_set, "mse": mse}
        walks = {n: su.round_walk(f, rs) for n, f in walked.items()} if rs is not None else {}
        pick = _choose_export(cfg, walked, walks, replay, depth)
        fits = {"student_oof": mse if pick.export_mse else by_set[pick.winner]}
        fits.update({f"student_{n}_oof": f for n, f in by_set.items() if len(by_set) > 1 or pick.export_mse})
        fits["student_mse_oof"] = mse
        ablations, blind_walk = _ablation_fits(su, tg, pick.winner, per_fold, signals.by_pair_fold, bar)
        fits.update(ablations)
        if blind_walk is not None:
            walks["no_lookahead"] = blind_walk
        final = (
            fit_student(su.z(signals.chosen), tg.final, np.ones(len(su.folds), dtype=bool), mse_spec)
            if pick.export_mse
            else _final_student(su, pick.winner, signals.chosen, tg.final)
        )
        bar.update()
    lookahead_lead = (pick.winner, *paired_lead(walks[pick.winner], walks["no_lookahead"])) if walks else None
    leads = (pick.mse_lead, pick.best, lookahead_lead)
    if pick.export_mse:
        return Students(fits, final, 0.0, "canonical", by_set, "mse", walks, *leads)
    # Each fold's threshold was chosen by the same procedure on 1 - 1/k of the reports: their median
    # is that procedure's choice. Re-choosing on the pooled OOF scores would mix k models' scales
    # (on synthetic data the largest near-best t there was 3x the folds' own).
    threshold = float(np.median(by_set[pick.winner].thresholds))
    return Students(fits, final, threshold, pick.winner, by_set, su.spec.loss, walks, *leads)


def _final_student(su: _Setup, name: str, signals: tuple[str, ...], margin: np.ndarray) -> FittedStudent:
    """The exported student: training set ``name`` of every report, epochs scaled to its rows."""
    zr = None if su.rs is None else su.rs.z(su.depth, signals)
    rows = set_inputs(name, su.z(signals), margin, su.folds, su.rs, zr).rows(su.folds)
    final_spec = scaled_epochs(su.spec, len(rows.folds), len(su.folds))
    return fit_student(rows.z, rows.margin, np.ones(len(rows.folds), dtype=bool), final_spec)
