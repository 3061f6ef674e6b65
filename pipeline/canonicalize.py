"""DVC stage ``canonicalize``: action rows -> canonical states (2^D - 1 per report) + grouped folds.

Reads ``collect.out_dir/actions.parquet``, verified against its value contract and the sha256 that
collect recorded for it in ``tables.json`` (a warning if collect's record is missing); writes
``canonicalize.out_dir/`` states.parquet, samples.parquet (features/schemas.py) and metrics.json.
The fold column (features/folds.py's report split) is reused by every later stage; metrics.json
states the assignment of both splits (report-grouped Latin square and leave one pair out) report by
report. One MLflow run ``canonicalize``.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from collectors.evaluation.plots import new_figure
from config.params import Params, resolve
from features.canonical import canonicalize
from features.collect_schemas import actions_spec
from features.folds import fold_table
from features.schemas import samples_spec, states_spec
from features.tables import MANIFEST, read_manifest, read_table, write_table
from pipeline.cli import run_stage
from pipeline.tracking import log_figure, log_metrics, stage_run, write_json

log = logging.getLogger(__name__)


def main(params: Params) -> dict:
    depth = params.tree.depth
    out = resolve(params.canonicalize.out_dir)
    with stage_run("canonicalize", params):
        src = resolve(params.collect.out_dir)
        if "actions.parquet" not in read_manifest(src):
            log.warning(
                "%s records no digest of actions.parquet: read unverified against collect", src / MANIFEST
            )
        actions = read_table(src / "actions.parquet", actions_spec(depth))
        tables = canonicalize(actions, depth, params.canonicalize.n_folds)
        state_table = tables.states
        write_table(out / "states.parquet", states_spec(depth), state_table)
        write_table(out / "samples.parquet", samples_spec(depth), tables.samples)
        states = state_table.to_pydict()
        assignment = fold_table(state_table)
        per_report = Counter(states["report_id"])
        metrics = {
            "n_action_rows": actions.num_rows,
            "n_reports": len(per_report),
            "n_states": tables.states.num_rows,
            "states_per_report": min(per_report.values()),
            "n_folds": len({row["report_fold"] for row in assignment}),
            "reports_per_fold": {
                str(f): n for f, n in sorted(Counter(row["report_fold"] for row in assignment).items())
            },
            "n_pair_folds": len({row["pair_fold"] for row in assignment} - {None}),  # 0: one pair
            "mean_rows_per_state": float(np.mean(states["n_rows"])),
            "fold_split": "report: (pair index + dataset index) mod k, Latin square (features/folds.py)",
            "folds": {row.pop("report_id"): row for row in assignment},
        }
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        _plot(states["step"], states["n_rows"], depth)
    log.info("%d states from %d action rows", metrics["n_states"], metrics["n_action_rows"])
    return metrics


def _plot(steps: list[int], n_rows: list[int], depth: int) -> None:
    fig, ax = new_figure()
    for k in range(1, depth + 1):
        rows = [n for s, n in zip(steps, n_rows, strict=True) if s == k]
        ax.bar(k, float(np.mean(rows)), color="tab:blue")
        ax.text(k, float(np.mean(rows)), f"{len(rows)} states", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("step k")
    ax.set_ylabel("action rows merged per state")
    ax.set_title("canonical states per step (all reports)")
    log_figure(fig, "states_per_step.png")


if __name__ == "__main__":
    run_stage("canonicalize", main)
