"""The six learning stages end to end on synthetic collectors' tables (real schemas), smoke profile.

Checks every output dvc.yaml declares for these stages, the metrics files, the parameter counts,
and that each stage left one MLflow run of its name with params, metrics and a plot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from synthetic_collect import write_synthetic_collect

from config.params import ROOT, Params, load_params
from decoder.scheduler import load_scheduler, load_value_planner
from features.schemas import margins_spec, states_spec
from features.tables import read_table
from pipeline.cli import stage_params

STAGES = ("canonicalize", "select_signals", "fit_value", "margins", "distill", "export")


def _declared_paths(params: Params) -> dict[str, list[Path]]:
    """outs/metrics/plots of our stages in dvc.yaml, with ${section.key} resolved from params."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]

    def resolve(text: str) -> Path:
        return Path(re.sub(r"\$\{(\w+)\.(\w+)\}", lambda m: str(getattr(getattr(params, m[1]), m[2])), text))

    out = {}
    for stage in STAGES:
        entries = [e for key in ("outs", "metrics", "plots") for e in spec[stage].get(key, [])]
        out[stage] = [resolve(next(iter(e)) if isinstance(e, dict) else e) for e in entries]
    return out


@pytest.fixture(scope="module")
def run_all(tmp_path_factory) -> tuple[Params, dict[str, dict]]:
    root = tmp_path_factory.mktemp("learning")
    write_synthetic_collect(root / "collect", n_reports=6, depth=5, seed=1)
    overrides = {"collect": {"out_dir": str(root / "collect")}, "mlflow": {"db": str(root / "mlflow.db")}}
    overrides |= {s: {"out_dir": str(root / s)} for s in STAGES}
    params = load_params(profile="smoke", overrides=overrides)
    import importlib

    results = {s: importlib.import_module(f"pipeline.{s}").main(stage_params(s, params)) for s in STAGES}
    return params, results


def test_every_declared_output_exists(run_all):
    params, _ = run_all
    for stage, paths in _declared_paths(params).items():
        assert paths, stage
        for path in paths:
            assert path.exists(), f"{stage}: {path} declared in dvc.yaml was not written"
            if path.name == "metrics.json":
                assert json.loads(path.read_text())


def test_stage_results(run_all):
    params, res = run_all
    assert res["canonicalize"]["n_states"] == 6 * 31 and res["canonicalize"]["states_per_report"] == 31
    assert res["canonicalize"]["n_folds"] == 5
    assert res["select_signals"]["n_subsets_size_6"] == 210
    assert len(json.loads((Path(params.select_signals.out_dir) / "signals.json").read_text())["signals"]) == 6
    assert res["fit_value"]["n_params"] == 45_572
    assert res["margins"]["brute_force_max_abs_diff"] < 1e-9
    assert res["distill"]["n_params"] == 3_265
    offline = res["distill"]["offline"]
    assert offline["best"]["mean_pct_of_best"] == 100.0
    assert all(0 < v["mean_pct_of_best"] <= 100.0 for v in offline.values())
    assert res["export"]["student_numpy_vs_torch_max_abs"] < 1e-4
    assert res["export"]["student_onnx_vs_numpy_max_abs"] < 1e-3
    depth = params.tree.depth
    states = read_table(Path(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(Path(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    assert margins.column("state_id").to_pylist() == states.column("state_id").to_pylist()
    assert np.all(np.isfinite(margins.column("margin_oracle_tok_per_s").to_numpy()))


def test_exported_artifacts_load_in_the_decoder(run_all):
    params, _ = run_all
    out = Path(params.export.out_dir)
    sched = load_scheduler(out / "scheduler.json", params.tree.depth, params.tree.width)
    planner = load_value_planner(out / "value_planner.json", params.tree.depth, params.tree.width)
    manifest = sched.manifest
    assert len(manifest["feature_names"]) == 17 and manifest["depth"] == 5
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["training_data_sha256"])
    assert manifest["git_revision"] and "offline" in manifest["metrics"]
    assert isinstance(sched.decide(np.zeros(17)), bool) and np.isfinite(planner.margin(np.zeros(17), 1))


def test_each_stage_is_one_mlflow_run_with_params_metrics_and_a_plot(run_all):
    from mlflow import MlflowClient

    from pipeline.tracking import tracking_uri

    params, _ = run_all
    client = MlflowClient(tracking_uri(params.mlflow))
    exp = client.get_experiment_by_name(params.mlflow.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in runs) == sorted(STAGES)
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params and run.data.metrics, run.info.run_name
        plots = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
        want = {"fit_value": "oof_nmae_A_invoke", "distill": "offline.student_oof.mean_pct_of_best"}
        assert want.get(run.info.run_name, next(iter(run.data.metrics))) in run.data.metrics
        assert any(p.endswith(".png") for p in plots), run.info.run_name
