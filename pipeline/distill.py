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

The stage loads, calls models/distill_run.py's ``distill`` and writes: targets and fits in
models/student_selection.py, threshold rules in models/thresholds.py, round walks in
models/round_walks.py, gates in models/gate.py, the offline rows and metrics in
models/distill_metrics.py, the table in models/distill_markdown.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlflow
import pyarrow as pa

from collectors.collect.pool import WorkerPool
from config.params import Params, resolve
from decoder.deploy.scheduler import write_artifact
from decoder.io.files import sha256_of_file
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.schemas import margins_spec, states_spec
from features.signals_file import read_fold_signals, read_signals
from features.tables import read_table
from models.cross_fit import pool_fitter
from models.distill_run import Distilled, DistillInputs, distill, student_export
from models.round_walks import RoundSet, round_set
from models.student_selection import SignalSets, train_sets
from pipeline.cli import run_stage
from pipeline.tracking import git_revision, log_figure, log_metrics, stage_run, write_csv, write_json

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


def read_inputs(params: Params) -> DistillInputs:
    """The canonical states, margins, trajectories, round states (where a training set reads them)
    and signal subsets distill reads."""
    depth = params.tree.depth
    states = read_table(resolve(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(resolve(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    trajectories = read_table(resolve(params.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    needs_rounds = train_sets(params.distill.train_set) != ("canonical",)
    rs = read_round_set(params, states) if needs_rounds else None
    return DistillInputs(states, margins, trajectories, rs, read_signal_sets(params))


def main(params: Params) -> dict:
    inputs = read_inputs(params)
    workers = WorkerPool(params.distill.workers, 1, keep_freed=False)
    with stage_run("distill", params), workers as pool:
        done = distill(params.distill, params.tree.depth, inputs, pool_fitter(pool))
        write_outputs(resolve(params.distill.out_dir), params, done)
        log_metrics(done.metrics)
        mlflow.log_text(done.table, "offline.md")
        for name, fig in done.figures.items():
            log_figure(fig, name)
    log.info("offline table:\n%s", done.table)
    return done.metrics


def write_outputs(out: Path, params: Params, done: Distilled) -> None:
    """student.{json,safetensors}, offline.csv, offline.md, curves.csv and metrics.json."""
    extra = {
        **done.manifest_fields,
        "training_data_sha256": sha256_of_file(resolve(params.collect.out_dir) / "actions.parquet"),
        "git_revision": git_revision(),
        "metrics": done.metrics,
    }
    manifest, arrays = student_export(
        done.student, params.tree.depth, params.tree.width, done.feature_names, extra
    )
    write_artifact(out / "student", manifest, arrays)
    write_csv(out / "offline.csv", done.offline_rows)
    (out / "offline.md").write_text(done.table)
    write_csv(out / "curves.csv", done.curve_rows)
    write_json(out / "metrics.json", done.metrics)


if __name__ == "__main__":
    run_stage("distill", main)
