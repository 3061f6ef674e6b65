"""DVC stage ``collect``: all 2^D fixed schedules per report into Parquet, resumable.

Writes ``collect.out_dir/reports/<report_id>/`` (atomic per report, with its resume inputs in its
manifest; a rerun reuses a finished report only if everything that shapes it is unchanged, and
recollects a mismatched or corrupt one with a warning naming the file), then the merged
``trajectories.parquet``, ``actions.parquet``, ``rounds.parquet``, ``continuations.parquet`` (each
prompt's greedy continuation, which evaluate_graft's budget choice reads; reports in plan order),
``tables.json`` (their sha256, which every later read verifies: features/tables.py),
``summary.md`` (best schedule per report vs All-Small and All-Mid) and ``metrics.json``. The local
backend collects in ``collect.workers`` processes (collectors/collect/pool.py), each report written by the
worker that collected it; the tables are byte for byte those of one process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from collectors.collect.plan import plan_reports, run_report
from collectors.collect.pool import Task, pool_device, run_tasks
from collectors.collect.report import (
    ReportSpec,
    completed_reports,
    read_report,
    remove_stale_temps,
    specs_for,
)
from collectors.collect.summary import summarise
from config.params import Params, resolve
from features.tables import write_tables
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)


def main(params: Params) -> dict:
    with stage_run("collect", params):
        metrics = collect(params)
        log_metrics({k: v for k, v in metrics.items() if k != "reports"})  # counts; per report: the file
    return metrics


def collect(params: Params) -> dict:
    apply_runtime(params)
    plan = plan_reports(params)
    depth = params.tree.depth
    if plan.reports_dir.is_dir():
        remove_stale_temps(plan.reports_dir)
    done = completed_reports(plan.reports_dir, plan.inputs)
    todo = [s for s in plan.reports if s.report_id not in done]
    log.info(
        "%d reports, %d already complete, %d to collect",
        len(plan.reports),
        len(plan.reports) - len(todo),
        len(todo),
    )
    if todo and params.collect.backend == "ray":
        from collectors.collect.ray_backend import run_on_ray

        run_on_ray(params, todo, plan.reports_dir, inputs=plan.inputs)
    elif todo:
        run_local(params, todo, plan.reports_dir, plan.inputs)
    out = resolve(params.collect.out_dir)
    merged = merge_reports(out, plan.reports_dir, plan.inputs, depth)
    summary, metrics = summarise(merged["trajectories"], merged["rounds"], seed=params.collect.seed)
    (out / "summary.md").write_text(summary + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(summary)
    return metrics


def run_local(
    params: Params, todo: list[ReportSpec], reports_dir: Path, inputs: Mapping[str, Mapping[str, object]]
) -> None:
    """The local backend: ``collect.workers`` processes (1: this one), each report written atomically
    by whoever collects it, in plan order."""
    workers = params.collect.workers
    tasks = [Task(s.report_id, (params, s, reports_dir, workers <= 1, inputs[s.report_id])) for s in todo]
    with tqdm(total=len(tasks), desc="reports", unit="report") as bar:
        run_tasks(
            run_report, tasks, workers, params.runtime.torch_threads, lambda t, r: bar.update(),
            params.runtime.keep_freed_memory, pool_device(params.pairs[s.pair_id].device for s in todo),
        )  # fmt: skip


def merge_reports(
    out: Path, reports_dir: Path, inputs: Mapping[str, Mapping[str, object]], depth: int
) -> dict[str, pa.Table]:
    """Concatenate the planned reports' tables (in plan order) into the stage's merged tables.

    Every report is checked against its inputs again (a ReportError names the file), so a folder
    that changed under the run never slips in; the merged tables are checked against their value
    contracts as they are written, and their digests recorded in ``tables.json``.
    """
    reports = [read_report(reports_dir / report_id, depth, i) for report_id, i in inputs.items()]
    specs = specs_for(depth)
    merged = {name: pa.concat_tables([getattr(r, name) for r in reports]) for name in specs}
    write_tables(out, {name: (spec, merged[name]) for name, spec in specs.items()})
    return merged


if __name__ == "__main__":
    run_stage("collect", main)
