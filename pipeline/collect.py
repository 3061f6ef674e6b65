"""DVC stage ``collect``: all 2^D fixed schedules per report into Parquet, resumable.

Writes ``collect.out_dir/reports/<report_id>/`` (atomic per report; a rerun resumes at the first
missing report), then the merged ``trajectories.parquet``, ``actions.parquet``, ``rounds.parquet``,
``summary.md`` (best schedule per report vs All-Small and All-Mid) and ``metrics.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from collectors.plan import plan_reports, run_report
from collectors.report import completed_reports, specs_for
from collectors.summary import summarise
from config.params import Params, resolve
from features.tables import read_table, write_table
from pipeline.cli import apply_runtime, run_stage

log = logging.getLogger(__name__)


def main(params: Params) -> dict:
    apply_runtime(params)
    plan = plan_reports(params)
    depth = params.tree.depth
    done = completed_reports(plan.reports_dir, depth)
    todo = [s for s in plan.reports if s.report_id not in done]
    log.info(
        "%d reports, %d already complete, %d to collect",
        len(plan.reports),
        len(plan.reports) - len(todo),
        len(todo),
    )
    if todo and params.collect.backend == "ray":
        from collectors.ray_backend import run_on_ray

        run_on_ray(params, todo, plan.reports_dir)
    else:
        for spec in tqdm(todo, desc="reports", unit="report"):
            run_report(params, spec, plan.reports_dir)
    out = resolve(params.collect.out_dir)
    merged = merge_reports(out, plan.reports_dir, [s.report_id for s in plan.reports], depth)
    summary, metrics = summarise(merged["trajectories"], merged["rounds"])
    (out / "summary.md").write_text(summary + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(summary)
    return metrics


def merge_reports(out: Path, reports_dir: Path, report_ids: list[str], depth: int) -> dict[str, pa.Table]:
    """Concatenate the planned reports' tables (in plan order) into the stage's merged tables."""
    merged = {}
    for name, spec in specs_for(depth).items():
        parts = [read_table(reports_dir / r / f"{name}.parquet", spec) for r in report_ids]
        merged[name] = pa.concat_tables(parts)
        write_table(out / f"{name}.parquet", spec, merged[name])
    return merged


if __name__ == "__main__":
    run_stage("collect", main)
