"""DVC stage ``export``: the decoder's artifacts, validated by the decoder's own loader.

Copies the distilled student and the value system into ``export.out_dir/`` as
scheduler.{json,safetensors} and value_planner.{json,safetensors} with provenance (training
data sha256, git revision, both stages' metrics), loads them back with decoder/deploy/scheduler.py
(every manifest field, feature order, D, W, both checksums), checks NumPy outputs against the
torch modules and an ONNX export of the student against NumPy. Times NumPy decisions.
Writes metrics.json and decision_latency.csv.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import mlflow
import numpy as np
import torch

from collectors.evaluation.plots import new_figure
from config.params import Params, resolve
from decoder.core.state import state_feature_names
from decoder.deploy.artifact import WRITER_FIELDS, Artifact, read_artifact, write_artifact
from decoder.deploy.planning import HEADS, value_inputs
from decoder.deploy.scheduler import load_scheduler, load_value_planner
from features.datasets import state_matrix
from features.schemas import states_spec
from features.tables import read_table
from models.mlp import load_mlp_arrays
from models.onnx_export import head_to_onnx, run_onnx
from models.student import HEAD, Student
from models.value import ValueSystem
from pipeline.cli import run_stage
from pipeline.scheduler_model import log_scheduler_model
from pipeline.tracking import (
    git_revision,
    log_figure,
    log_metrics,
    stage_run,
    write_csv,
    write_json,
)

log = logging.getLogger(__name__)


def _torch_student(art: Artifact, z: np.ndarray) -> np.ndarray:
    m = art.manifest
    net = Student(len(m["input_names"]), m["heads"][HEAD][1:-1])
    load_mlp_arrays(HEAD, net.net, art.arrays)
    x = (z - np.asarray(m["x_mean"])) / np.asarray(m["x_std"])
    with torch.no_grad():
        out = net(torch.as_tensor(x, dtype=torch.float32)).double().numpy()[:, 0]
    return out * m["y_std"][HEAD] + m["y_mean"][HEAD]


def _torch_value(art: Artifact, x: np.ndarray) -> np.ndarray:
    m = art.manifest
    net = ValueSystem(len(m["input_names"]), m["heads"][HEADS[0]][1:-1])
    for h in HEADS:
        load_mlp_arrays(h, net.heads[h], art.arrays)
    xs = (x - np.asarray(m["x_mean"])) / np.asarray(m["x_std"])
    with torch.no_grad():
        out = net(torch.as_tensor(xs, dtype=torch.float32)).double().numpy()
    return out * np.array([m["y_std"][h] for h in HEADS]) + np.array([m["y_mean"][h] for h in HEADS])


def _republish(src: Path, dst: Path, kind: str, metrics: dict) -> Artifact:
    """Copy a validated artifact with this revision and more metrics (checksums recomputed)."""
    art = read_artifact(src, kind)
    manifest = {k: v for k, v in art.manifest.items() if k not in WRITER_FIELDS}
    manifest.update(git_revision=git_revision(), metrics={**manifest.get("metrics", {}), **metrics})
    write_artifact(dst, manifest, art.arrays)
    return read_artifact(dst, kind)


def _time_decisions(decide: Callable[[np.ndarray], bool], z: np.ndarray, n: int) -> np.ndarray:
    """Microseconds per decision, one sample per decision (states cycled)."""
    rows = [z[i % len(z)].copy() for i in range(n)]
    for r in rows[:50]:
        decide(r)
    samples = np.empty(n)
    for i, r in enumerate(rows):
        t0 = time.perf_counter()
        decide(r)
        samples[i] = time.perf_counter() - t0
    return 1e6 * samples


def main(params: Params) -> dict:
    depth, width, cfg = params.tree.depth, params.tree.width, params.export
    out = resolve(cfg.out_dir)
    with stage_run("export", params):
        value_metrics = json.loads((resolve(params.fit_value.out_dir) / "metrics.json").read_text())
        student_art = _republish(
            resolve(params.distill.out_dir) / "student.json", out / "scheduler", "student", {}
        )
        value_art = _republish(
            resolve(params.fit_value.out_dir) / "value.json", out / "value_planner", "value", value_metrics
        )
        scheduler = load_scheduler(out / "scheduler.json", depth, width)
        planner = load_value_planner(out / "value_planner.json", depth, width)
        states = read_table(resolve(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
        z = state_matrix(states, state_feature_names(depth, student_art.manifest["signals"]))
        numpy_margin = np.array([scheduler.margin(r) for r in z])
        x = value_inputs(z, ["0" * (depth - 1)] * len(z), depth)
        micros = _time_decisions(scheduler.decide, z, cfg.bench_decisions)
        metrics = {
            "student_numpy_vs_torch_max_abs": float(
                np.max(np.abs(numpy_margin - _torch_student(student_art, z)))
            ),
            "value_numpy_vs_torch_max_abs": float(
                np.max(np.abs(planner.predict(x) - _torch_value(value_art, x)))
            ),
            "decision_us_median": float(np.median(micros)),
            "decision_us_p90": float(np.percentile(micros, 90)),
            "share_invoke_states": float(np.mean(numpy_margin > scheduler.threshold)),
        }
        head_to_onnx(student_art.manifest, student_art.arrays, HEAD, out / "scheduler.onnx")
        onnx_margin = run_onnx(out / "scheduler.onnx", z)
        metrics["student_onnx_vs_numpy_max_abs"] = float(np.max(np.abs(onnx_margin - numpy_margin)))
        write_csv(
            out / "decision_latency.csv", [{"decision": i, "us": float(u)} for i, u in enumerate(micros)]
        )
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        # The manifest and weights as files, the ONNX graph, and the scheduler as a pyfunc model
        # (input signature: the named state features) that predicts with the NumPy student.
        for name in ("scheduler.json", "scheduler.safetensors", "scheduler.onnx"):
            mlflow.log_artifact(str(out / name), "export")
        log_scheduler_model(out / "scheduler.json")
        _plot(micros, numpy_margin)
    log.info(
        "exported %s: %.2f us per decision (median)", out / "scheduler.json", metrics["decision_us_median"]
    )
    return metrics


def _plot(micros: np.ndarray, margins: np.ndarray) -> None:
    fig, ax = new_figure()
    ax.hist(np.clip(micros, 0, np.percentile(micros, 99)), bins=50)
    ax.set_xlabel("NumPy student decision time (us, feature extraction excluded)")
    ax.set_ylabel("decisions")
    log_figure(fig, "decision_latency.png")
    fig, ax = new_figure()
    ax.hist(margins, bins=50)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("student margin on the canonical states (invoke iff > threshold)")
    log_figure(fig, "student_margins.png")


if __name__ == "__main__":
    run_stage("export", main)
