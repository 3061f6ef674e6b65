"""DVC stage ``distill``: the student MLP on z alone learns the invoke/skip margin; offline table.

Targets: ``distill.margin_source`` value (the paper: value-system margins) or oracle; with
``distill.relative`` the margin is divided by the state's best realised tokens/s (a positive
per-state scale, so signs are kept and fast and slow reports weigh alike). Objective
``distill.loss`` (models/student.py) and a decision threshold chosen inside each outer fold's
training part (models/cross_fit.py; "when unsure, skip": t >= 0) by ``distill.threshold_rule``:
rounds (models.thresholds.round_chooser: the round walk over the training reports' round-table starts, the
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
``skip_rounds_max``: models.gate.choose_skip_rest, which takes a gate unless deciding every step
leads it by more than one standard error over the reports, and models.gate.choose_skip_rounds),
offline.csv, offline.md, curves.csv and metrics.json.

The stage loads, calls and writes: targets and fits in models/student_selection.py, threshold
rules in models/thresholds.py, round walks in models/round_walks.py, gates in models/gate.py,
the offline rows and metrics in models/distill_metrics.py, the table in models/distill_markdown.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa

from collectors.evaluation.plots import new_figure
from config.params import Params, resolve
from decoder.scheduler import build_manifest, write_artifact
from decoder.state import state_feature_names
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.datasets import column, state_matrix
from features.folds import fold_rows
from features.schemas import margins_spec, states_spec
from features.tables import read_table
from models.cross_fit import FittedStudent
from models.distill_markdown import offline_markdown, offline_rows
from models.distill_metrics import LABELS, Results, distill_metrics, manifest_fields, offline
from models.gate import RoundPolicy, round_policy
from models.mlp import count_parameters, mlp_arrays
from models.round_walks import RoundSet, round_set
from models.student import HEAD, student_param_count
from models.student_selection import SignalSets, fit_students, replay_of, targets, train_sets
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


def read_round_set(params: Params, states: pa.Table) -> RoundSet:
    depth = params.tree.depth
    rounds = read_table(resolve(params.collect.out_dir) / "rounds.parquet", rounds_spec(depth))
    actions = read_table(resolve(params.collect.out_dir) / "actions.parquet", actions_spec(depth))
    return round_set(rounds, actions, states, depth, params.distill.relative)


def read_signal_sets(params: Params) -> SignalSets:
    try:
        by_pair = read_fold_signals(params, "pair")
    except KeyError:  # fewer than 3 pairs: select_signals wrote no nested pair split
        by_pair = []
    return SignalSets(read_signals(params), read_fold_signals(params, "report"), by_pair)


def _pair_of(states: pa.Table) -> dict[str, str]:
    """report id -> pair id."""
    reports, pairs = states.column("report_id").to_pylist(), states.column("pair_id").to_pylist()
    return dict(zip(reports, pairs, strict=True))


def main(params: Params) -> dict:
    depth, cfg = params.tree.depth, params.distill
    out = resolve(cfg.out_dir)
    states = read_table(resolve(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(resolve(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    trajectories = read_table(resolve(params.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    signals = read_signal_sets(params)
    names = state_feature_names(depth, signals.chosen)
    z = state_matrix(states, names)
    tg = targets(margins, cfg.margin_source, cfg.relative)
    replay = replay_of(states, trajectories)
    rs = read_round_set(params, states) if train_sets(cfg.train_set) != ("canonical",) else None
    with stage_run("distill", params):
        regret = targets(margins, "oracle", relative=True).oracle
        st = fit_students(cfg, depth, states, tg, regret, replay, rs, signals)
        n_params = count_parameters(st.final.module)
        if n_params != student_param_count(z.shape[1], cfg.hidden):
            raise RuntimeError(
                f"student has {n_params} parameters, not {student_param_count(z.shape[1], cfg.hidden)}"
            )
        value_oof = column(margins, "margin_value_oof_tok_per_s")
        off = offline(st, value_oof, z, fold_rows(states, "report"), replay, _pair_of(states), depth)
        oof = st.fits["student_oof"]
        policy = RoundPolicy() if rs is None else round_policy(oof, rs, depth, signals.by_report_fold)
        metrics = {
            "n_params": n_params,
            "n_states": len(z),
            **distill_metrics(cfg, st, tg, regret, off, rs, depth, policy),
        }
        extra = {
            **manifest_fields(cfg, st, policy, signals.chosen),
            "training_data_sha256": file_sha256(resolve(params.collect.out_dir) / "actions.parquet"),
            "git_revision": git_revision(),
            "metrics": metrics,
        }
        _save(out, st.final, params, names, extra)
        write_csv(out / "offline.csv", offline_rows(off.results))
        table = offline_markdown(off.results, metrics["train_set"], metrics)
        (out / "offline.md").write_text(table)
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
        _plot(off.results, curves)
    log.info("offline table:\n%s", table)
    return metrics


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


def _plot(results: Results, curves: dict[str, Curve]) -> None:
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
