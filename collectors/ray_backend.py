"""Scale-out: one Ray task per report on an existing Ray cluster (or a local instance).

Each task loads its own pair and writes its own report folder atomically, so tasks need no
coordination and a failed task is simply collected again on the next run. GPU resources per task
come from params (collect.ray.gpus_per_task); with address=None a local instance is started.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from collectors.plan import run_report
from collectors.report import ReportSpec
from config.params import Params

log = logging.getLogger(__name__)


def _task(params: Params, spec: ReportSpec, reports_dir: str) -> str:
    import torch

    torch.set_num_threads(1)
    return str(run_report(params, spec, Path(reports_dir), progress=False))


def run_on_ray(
    params: Params, specs: list[ReportSpec], reports_dir: Path, address: str | None = None
) -> list[Path]:
    """Submit every report as a task and wait for all of them; returns the written folders."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from tqdm import tqdm

    cfg = params.collect.ray
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, num_gpus=cfg.gpus_per_task)(_task)
        pending = [remote.remote(params, s, str(reports_dir)) for s in specs]
        done: list[Path] = []
        with tqdm(total=len(pending), desc="reports (ray)") as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                done += [Path(p) for p in ray.get(ready)]
                bar.update(len(ready))
        return done
    finally:
        if started:
            ray.shutdown()
