"""MLflow tracking: stage runs grouped under one pipeline run, provenance tags, declared params, and
the exported scheduler as a pyfunc model that predicts what the decoder's NumPy student predicts.

Every test writes to a temporary SQLite store (params ``mlflow.db`` overridden).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from config.params import ROOT, Params, load_params
from decoder.core.state import SIGNAL_NAMES, state_feature_names
from decoder.deploy.artifact import build_manifest, write_artifact
from decoder.deploy.scheduler import load_scheduler
from pipeline.cli import stage_params
from pipeline.provenance import data_hash, declared_values, git_revision, json_sha256, stage_inputs
from pipeline.tracking import (
    PARENT_ENV,
    end_pipeline,
    log_metrics,
    open_store,
    stage_run,
    start_pipeline,
    tracking_uri,
    ui_links,
)

PARENT_TAG = "mlflow.parentRunId"


def _params(tmp_path: Path, profile: str = "smoke") -> Params:
    overrides = {
        "mlflow": {"db": str(tmp_path / "mlflow.db")},
        "collect": {"out_dir": str(tmp_path / "collect")},
        "canonicalize": {"out_dir": str(tmp_path / "canonicalize")},
    }
    return load_params(profile=profile, overrides=overrides)


def _run(stage: str, params: Params, metrics: dict | None = None) -> str:
    with stage_run(stage, stage_params(stage, params)) as run:
        log_metrics(metrics or {"n_rows": 3})
    return run.info.run_id


def _get(params: Params, run_id: str):
    client, _ = open_store(params.mlflow)
    return client.get_run(run_id)


def _pipeline_runs(params: Params) -> list:
    client, exp_id = open_store(params.mlflow)
    return client.search_runs([exp_id], filter_string="tags.`pipeline.kind` = 'pipeline'", max_results=50)


def test_two_stages_of_one_pipeline_run_share_its_parent(tmp_path, monkeypatch):
    params = _params(tmp_path)
    parent = start_pipeline(params)
    monkeypatch.setenv(PARENT_ENV, parent)
    a = _run("canonicalize", params, {"n_states": 186})
    b = _run("margins", params, {"n_states": 93})
    assert _get(params, a).data.tags[PARENT_TAG] == parent == _get(params, b).data.tags[PARENT_TAG]
    assert [r.info.run_id for r in _pipeline_runs(params)] == [parent]
    # The parent carries each stage's metrics under the stage's name, so pipeline runs compare.
    got = _get(params, parent).data.metrics
    assert got["canonicalize/n_states"] == 186 and got["margins/n_states"] == 93
    assert "canonicalize/stage_seconds" in got
    assert end_pipeline(params, parent, 1)
    assert _get(params, parent).info.status == "FAILED"


def test_a_pipeline_run_where_no_stage_ran_is_removed(tmp_path):
    params = _params(tmp_path)
    parent = start_pipeline(params)
    assert _get(params, parent).info.status == "RUNNING"
    assert not end_pipeline(params, parent, 0)
    assert _get(params, parent).info.lifecycle_stage == "deleted"


def test_stage_run_tags_provenance_and_logs_every_declared_param(tmp_path, monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    params = _params(tmp_path)
    actions = Path(params.collect.out_dir) / "actions.parquet"
    actions.parent.mkdir(parents=True)
    actions.write_bytes(b"first version")
    seen = stage_params("canonicalize", params)
    run = _get(params, _run("canonicalize", params))
    tags = run.data.tags
    assert tags["git.revision"] == git_revision() and tags["git.dirty"] in ("true", "false")
    assert tags["pipeline.stage"] == "canonicalize" and tags["pipeline.overlay"] == "smoke"
    assert tags["params.hash"] == json_sha256(declared_values("canonicalize", seen))
    # its inputs: the code fingerprint, then its data deps, in dvc.yaml's order
    inputs = stage_inputs("canonicalize", seen)
    assert inputs[0].name == "canonicalize.json" and inputs[1] == actions
    assert tags["data.inputs"].split(",")[1] == str(actions) and tags["data.hash"] == data_hash(inputs)
    # Exactly what dvc.yaml declares: whole sections, single keys, nothing undeclared.
    logged = run.data.params
    assert set(logged) == set(declared_values("canonicalize", seen))
    assert logged["overlay"] == "smoke" and logged["tree.depth"] == str(params.tree.depth)
    assert logged["collect.out_dir"] == params.collect.out_dir
    assert logged["canonicalize.n_folds"] == str(params.canonicalize.n_folds)
    assert not any(k.startswith(("zoo.", "distill.", "mlflow.")) or k == "tree.width" for k in logged)
    assert run.data.metrics["stage_seconds"] >= 0
    # Same params, different input bytes: a different data hash.
    actions.write_bytes(b"second version")
    assert _get(params, _run("canonicalize", params)).data.tags["data.hash"] != tags["data.hash"]


def test_declared_values_of_a_decoding_stage_cover_its_sections(tmp_path):
    params = _params(tmp_path)
    values = declared_values("collect", stage_params("collect", params))
    assert values["collect.max_new_tokens"] == params.collect.max_new_tokens
    assert values["tree.width"] == params.tree.width and values["runtime.torch_threads"] >= 1
    some_pair = next(iter(params.pairs))
    assert values[f"pairs.{some_pair}.target"] == params.pairs[some_pair].target
    assert "zoo.out_dir" in values and "zoo.seed" not in values
    inputs = stage_inputs("collect", stage_params("collect", params))
    assert Path(params.data.out_dir).name in {p.name for p in inputs}
    assert not any(p.suffix == ".py" or "profiles" in p.parts for p in inputs)


def test_without_a_parent_id_a_stage_creates_one_and_later_stages_reuse_it(tmp_path, monkeypatch):
    monkeypatch.setenv(PARENT_ENV, "0123456789abcdef0123456789abcdef")  # not a run of this store
    params = _params(tmp_path)
    first = _get(params, _run("canonicalize", params)).data.tags[PARENT_TAG]
    monkeypatch.delenv(PARENT_ENV)
    second = _get(params, _run("margins", params)).data.tags[PARENT_TAG]
    assert first == second
    parent = _get(params, first)
    assert parent.data.tags["pipeline.overlay"] == "smoke" and parent.info.run_name.startswith("smoke @ ")
    assert parent.data.tags["git.revision"] == git_revision()
    # The parent logs the whole pipeline's params, so two pipeline runs compare in the UI.
    assert parent.data.params["overlay"] == "smoke"
    assert parent.data.params["zoo.seed"] == str(load_params(profile="smoke").zoo.seed)
    assert not any(k.startswith("mlflow.") for k in parent.data.params)
    # Another overlay is another pipeline run.
    other = _params(tmp_path, profile="base")
    third = _get(other, _run("canonicalize", other)).data.tags[PARENT_TAG]
    assert third != first
    assert {r.data.tags["pipeline.overlay"] for r in _pipeline_runs(params)} == {"smoke", "base"}


def test_stages_in_separate_processes_join_one_pipeline_run(tmp_path):
    """What `dvc repro` does: each stage is its own process (here with no parent id passed down)."""
    script = (
        "import sys; from config.params import load_params; from pipeline.cli import stage_params;"
        "from pipeline.tracking import stage_run;"
        "p = load_params(profile='smoke', overrides={'mlflow': {'db': sys.argv[2]}});"
        "cm = stage_run(sys.argv[1], stage_params(sys.argv[1], p)); run = cm.__enter__();"
        "cm.__exit__(None, None, None); print(run.info.run_id)"
    )
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    db = str(tmp_path / "mlflow.db")
    ids = [
        subprocess.run(
            [sys.executable, "-c", script, stage, db],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        for stage in ("canonicalize", "select_signals")
    ]
    params = _params(tmp_path)
    parents = {_get(params, i).data.tags[PARENT_TAG] for i in ids}
    assert len(parents) == 1 and [r.info.run_id for r in _pipeline_runs(params)] == list(parents)


def test_ui_links_land_on_runs_and_compare_the_newest_of_each_overlay(tmp_path):
    smoke, base = _params(tmp_path), _params(tmp_path, profile="base")
    old_smoke = start_pipeline(smoke)
    new_smoke, new_base = start_pipeline(smoke), start_pipeline(base)
    client, exp_id = open_store(smoke.mlflow)
    experiment, same_overlay, overlays = ui_links(smoke, "5001")
    assert experiment == f"http://127.0.0.1:5001/#/experiments/{exp_id}/runs"
    assert same_overlay.startswith("http://127.0.0.1:5001/#/compare-runs?runs=")
    assert new_smoke in same_overlay and old_smoke in same_overlay and new_base not in same_overlay
    assert new_smoke in overlays and new_base in overlays and old_smoke not in overlays
    assert _get(smoke, new_base).data.params["overlay"] == "base"
    # a model-training experiment: the UI opens on its runs, not the GenAI overview
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_closing_a_pipeline_run_logs_its_headline(tmp_path):
    params = _params(tmp_path)
    parent = start_pipeline(params)
    client, exp_id = open_store(params.mlflow)
    child = client.create_run(exp_id, tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_metric(child, "stage_seconds", 90.0)
    client.log_metric(parent, "zoo/stage_seconds", 120.0)
    client.log_metric(parent, "evaluate/stage_seconds", 60.0)
    client.log_metric(parent, "evaluate_graft/mean_speedup.full", 1.6)
    client.log_metric(parent, "evaluate_graft/mean_speedup.hindsight", 1.5)
    assert end_pipeline(params, parent, 0)
    got = client.get_run(parent).data.metrics
    assert got["headline/minutes.zoo"] == 2.0 and got["headline/minutes.pipeline"] == 3.0
    assert got["headline/graft_full_speedup"] == 1.6 and got["headline/graft_hindsight_speedup"] == 1.5
    assert "headline/deployed_gain_fitting_mean" not in got  # absent figures are not invented


def test_mlflow_tracking_uri_is_honoured(tmp_path, monkeypatch):
    params = _params(tmp_path)
    other = tmp_path / "elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    assert tracking_uri(params.mlflow) == f"sqlite:///{other}"
    start_pipeline(params)
    assert other.is_file()


SIGNALS = SIGNAL_NAMES[:6]
NAMES = state_feature_names(5, SIGNALS)


def _student(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    sizes = [len(NAMES), 16, 8, 1]
    arrays = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        arrays[f"margin.{i}.weight"] = rng.normal(size=(b, a)) / np.sqrt(a)
        arrays[f"margin.{i}.bias"] = rng.normal(size=b) * 0.1
    manifest = build_manifest(
        kind="student", depth=5, width=10, feature_names=NAMES, input_names=NAMES,
        x_mean=rng.normal(size=len(NAMES)), x_std=rng.uniform(0.5, 2.0, size=len(NAMES)),
        heads={"margin": sizes}, y_mean={"margin": 0.1}, y_std={"margin": 2.0}, signals=list(SIGNALS),
    )  # fmt: skip
    return write_artifact(path, manifest, arrays)


def test_the_exported_scheduler_loads_back_as_a_model_that_predicts_the_numpy_student(tmp_path):
    import mlflow

    from pipeline.scheduler_model import log_scheduler_model

    path = _student(tmp_path / "export" / "scheduler")
    params = _params(tmp_path)
    with stage_run("export", stage_params("export", params)) as run:
        info = log_scheduler_model(path)
    student = load_scheduler(path)
    z = np.random.default_rng(3).normal(size=(12, len(NAMES))) * 2
    frame = pd.DataFrame(z, columns=list(NAMES))
    for uri in (info.model_uri, f"runs:/{run.info.run_id}/scheduler"):
        model = mlflow.pyfunc.load_model(uri)
        assert model.metadata.get_input_schema().input_names() == list(NAMES)
        out = model.predict(frame)
        want = np.array([student.margin(r) for r in z])
        np.testing.assert_allclose(out["margin"].to_numpy(), want, rtol=1e-12, atol=1e-12)
        decisions = [student.decide(r) for r in z]
        assert out["invoke"].tolist() == decisions
        assert 0 < sum(decisions) < len(decisions)  # both decisions occur, so `invoke` is checked
    # The signature is enforced: a frame without one of the 17 features is refused.
    with pytest.raises(Exception, match=re.escape(NAMES[-1])):
        model.predict(frame.drop(columns=[NAMES[-1]]))
    # Its manifest travels with it and is the exported one.
    local = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "dl")))
    shipped = json.loads(next(local.rglob("scheduler.json")).read_text())
    assert shipped == json.loads(path.read_text())
    assert model.metadata.metadata["manifest_sha256"] == shipped["manifest_sha256"]


def test_every_stage_logs_the_headline_of_its_pipeline_run(tmp_path, monkeypatch):
    """A `dvc exp run`: its stages group under a parent they create, which no `end` closes; each
    stage logs that parent's headline from the metrics copied so far, and a closed run's headline is
    left as it is."""
    monkeypatch.delenv(PARENT_ENV, raising=False)
    params, repro = _params(tmp_path), _params(tmp_path, profile="base")  # another pipeline key
    closed = start_pipeline(repro)
    client, exp_id = open_store(params.mlflow)
    child = client.create_run(exp_id, tags={"mlflow.parentRunId": closed}).info.run_id
    client.log_metric(closed, "zoo/stage_seconds", 120.0)
    assert end_pipeline(repro, closed, 0) and child
    parent = _get(params, _run("canonicalize", params)).data.tags[PARENT_TAG]
    assert parent != closed
    got = _get(params, parent).data.metrics
    minutes = got["canonicalize/stage_seconds"] / 60
    assert got["headline/minutes.canonicalize"] == minutes and got["headline/minutes.pipeline"] == minutes
    assert "headline/minutes.margins" not in got
    _run("margins", params)  # the experiment's next stage joins the same parent
    got = _get(params, parent).data.metrics
    total = (got["canonicalize/stage_seconds"] + got["margins/stage_seconds"]) / 60
    assert got["headline/minutes.margins"] == got["margins/stage_seconds"] / 60
    assert got["headline/minutes.pipeline"] == pytest.approx(total)
    closed_metrics = _get(params, closed).data.metrics
    assert closed_metrics["headline/minutes.zoo"] == 2.0
    assert not any(k.startswith(("canonicalize/", "margins/")) for k in closed_metrics)
