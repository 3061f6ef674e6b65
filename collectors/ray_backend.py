"""Scale-out: the collect stage's reports on a Ray cluster (a running one, or a local instance).

Contract:
- Where: ``collect.ray.address`` ("auto", "host:port", "ray://host:port") joins a running cluster;
  when it is empty, the RAY_ADDRESS environment variable does; with neither, a local instance of
  ``collect.ray.num_cpus`` CPUs is started for the run and shut down after it.
- No shared filesystem: the driver reads every input (the pair checkpoints' files, the tokenized
  prompts, the latency profiles) and sends it through the object store, and the project's packages
  travel as the job's ``py_modules``. Workers return each report's Arrow tables through the object
  store; the driver writes the report folders (collectors.report.write_report, atomic), so a report
  exists on disk only once its tables are home. Nodes need the same Python packages installed.
- One actor per pair loads the pair once and runs that pair's reports in order. It holds
  ``runtime.torch_threads`` CPUs (the torch threads it runs, as the local backend does) and
  ``collect.ray.gpus_per_task`` GPUs, and is released when its last report is in, so pairs beyond
  the cluster's size start as others finish.
- The tables equal the local backend's byte for byte: same prompts (plan.report_prompts, on the
  driver), same decode config, same collect_report, same writer.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from tqdm import tqdm

from collectors.latency import LatencyProfile
from collectors.plan import pair_tree, profile_for, report_inputs, report_prompts
from collectors.report import ReportSpec, ReportTables, collect_report, write_report
from config.params import ROOT, Params, RayParams
from decoder.config import DecodeConfig
from decoder.memory import keep_freed_memory
from decoder.models import load_pair

log = logging.getLogger(__name__)
# What a worker imports of the project: shipped with the job, so no node needs a checkout.
PY_MODULES = tuple(str(ROOT / p) for p in ("config", "decoder", "features", "collectors"))


def read_folder(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` by relative POSIX path (a checkpoint folder to send)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint folder")
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def write_folder(files: dict[str, bytes], dest: Path) -> Path:
    """Recreate a folder read by :func:`read_folder` under ``dest``."""
    for rel, data in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dest


@dataclass(frozen=True)
class PairCheckpoint:
    """A registered pair's two model folders as bytes, and how to load them."""

    target: dict[str, bytes]
    mid: dict[str, bytes]
    dtype: str
    device: str
    linear: str


class PairWorker:
    """A Ray actor holding one pair's models; collects that pair's reports, returns their tables."""

    def __init__(self, checkpoint: PairCheckpoint, torch_threads: int, keep_freed: bool):
        torch.set_num_threads(torch_threads)
        if keep_freed:
            keep_freed_memory()
        with tempfile.TemporaryDirectory(prefix="treegraft-pair-") as tmp:
            target = write_folder(checkpoint.target, Path(tmp) / "target")
            mid = write_folder(checkpoint.mid, Path(tmp) / "mid")
            self.pair = load_pair(target, mid, checkpoint.dtype, checkpoint.device, checkpoint.linear)

    def collect(
        self,
        spec: ReportSpec,
        prompts: list[list[int]],
        profile: LatencyProfile,
        decode: DecodeConfig,
        mode: str,
        round_table_stride: int,
    ) -> ReportTables:
        return collect_report(spec, self.pair, prompts, profile, decode, mode, False, round_table_stride)


def connect(cfg: RayParams, address: str | None = None) -> bool:
    """Join the cluster at ``address`` / ``cfg.address`` / RAY_ADDRESS, else start a local instance.

    Returns whether this call connected (and so must call ``ray.shutdown``); an already
    initialized Ray is used as it is.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return False
    address = address or cfg.address or os.environ.get("RAY_ADDRESS", "")
    runtime_env = {"py_modules": list(PY_MODULES)}
    if address:
        log.info("ray: joining the cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    return True


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _checkpoint(params: Params, pair_id: str) -> ray.ObjectRef:
    target, mid = params.pair_paths(pair_id)
    spec = params.pairs[pair_id]
    checkpoint = PairCheckpoint(read_folder(target), read_folder(mid), spec.dtype, spec.device, spec.linear)
    return ray.put(checkpoint)


def run_on_ray(
    params: Params,
    specs: list[ReportSpec],
    reports_dir: Path,
    address: str | None = None,
    inputs: Mapping[str, Mapping[str, object]] | None = None,
) -> list[Path]:
    """Collect every report on Ray, one actor per pair; returns the report folders written.

    ``inputs`` (report_id -> plan.report_inputs, as plan_reports gives them) go into each report's
    manifest; missing ones are computed here.
    """
    inputs = dict(inputs or {})
    for spec in specs:
        if spec.report_id not in inputs:
            inputs[spec.report_id] = report_inputs(params, spec)
    started = connect(params.collect.ray, address)
    actors: dict[str, ray.actor.ActorHandle] = {}
    try:
        return _collect_all(params, specs, Path(reports_dir), inputs, actors)
    finally:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()


def _collect_all(
    params: Params,
    specs: list[ReportSpec],
    reports_dir: Path,
    inputs: Mapping[str, Mapping[str, object]],
    actors: dict[str, ray.actor.ActorHandle],
) -> list[Path]:
    cfg, threads = params.collect, params.runtime.torch_threads
    keep_freed = params.runtime.keep_freed_memory
    worker = ray.remote(PairWorker).options(num_cpus=threads, num_gpus=cfg.ray.gpus_per_task)
    by_pair: dict[str, list[ReportSpec]] = {}
    for spec in specs:
        by_pair.setdefault(spec.pair_id, []).append(spec)
    pending: dict[ray.ObjectRef, ReportSpec] = {}
    for pair_id, pair_specs in by_pair.items():
        actors[pair_id] = actor = worker.remote(_checkpoint(params, pair_id), threads, keep_freed)
        tokenizer, profile = _tokenizer(params.pair_paths(pair_id)[0]), profile_for(params, pair_id)
        decode = DecodeConfig(cfg.max_new_tokens, 0.0, cfg.seed, pair_tree(params, pair_id))
        for spec in pair_specs:
            prompts = report_prompts(params, spec, tokenizer)
            call = actor.collect.remote(spec, prompts, profile, decode, cfg.mode, cfg.round_table_stride)
            pending[call] = spec
    left = {pair_id: len(s) for pair_id, s in by_pair.items()}
    done: list[Path] = []
    with tqdm(total=len(pending), desc="reports (ray)", unit="report") as bar:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ready[0])
            tables = ray.get(ready[0])
            done.append(write_report(reports_dir, spec, tables, params.tree.depth, inputs[spec.report_id]))
            left[spec.pair_id] -= 1
            if not left[spec.pair_id]:
                ray.kill(actors.pop(spec.pair_id))  # its CPUs go to a pair still waiting
            bar.update()
    return done
