"""MLflow for the pipeline: one parent run per pipeline run, one child run per stage.

Contract: :func:`stage_run` points MLflow at the local SQLite store of ``params.mlflow`` (telemetry
off; run artifacts in ``mlruns/`` beside the database) and opens a run named after the stage, as a
child (``mlflow.parentRunId``) of the pipeline run, tagged with the git revision and dirty flag,
the code digest, the hash of the params it reads and of its input files (pipeline/provenance.py). It
logs every params entry the stage declares in dvc.yaml, flattened (``collect.max_new_tokens``),
and ``stage_seconds``; it closes the run (FAILED if the stage raised) and copies the stage's metrics
onto the parent as ``<stage>/<metric>``, so pipeline runs compare side by side in the UI.

The parent: ``make repro`` runs ``python -m pipeline.tracking start``, which creates it (tagged with
the overlay, revision, params hash and the code it starts on: ``code.digest`` of the working tree
and ``code.dirty``, whether that differs from the revision's; every param logged) and prints its
id, and passes the id to ``dvc repro`` in the environment variable TREEGRAFT_PIPELINE_RUN (tracking
only: no stage output depends on it); ``python -m pipeline.tracking end ID RC`` closes it, or
deletes it when no stage ran. A stage run without that variable (plain ``dvc repro``, ``dvc exp
run``, ``python -m pipeline.<stage>``) reuses the newest parent with the same pipeline key (git
revision, and the hash of params.yaml plus the stage's overlay) or creates one, so it is still
grouped.

Plots go through :func:`log_figure` (matplotlib, Agg backend). Metrics files are nested JSON for
``dvc metrics show``; plot data are CSV for ``dvc plots``.

The store is ``MLFLOW_TRACKING_URI`` when that is set, else the local SQLite file. The experiment is
tagged as a model-training one, so the UI opens on its runs. Closing a parent run logs a short
headline beside the copied metrics (``headline/...``, picked by pipeline/headline.py: deployed gain,
pricing agreement, GRAFT against DDTree's best budget in hindsight, minutes per stage).

CLI: ``python -m pipeline.tracking {start,end,ui}``; ``ui`` serves the MLflow UI on 127.0.0.1 (one
worker, no job execution) and prints links to the experiment's runs, to the two newest pipeline
runs of each overlay side by side, and to the newest of each overlay side by side.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from config.params import ROOT, MlflowParams, Params, load_params, resolve
from pipeline.headline import headline_metrics
from pipeline.provenance import (
    GitState,
    code_digest,
    commit_code_digest,
    data_hash,
    declared_values,
    flatten,
    git_state,
    json_sha256,
    pipeline_values,
    stage_inputs,
)
from pipeline.provenance import git_revision as git_revision

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

log = logging.getLogger(__name__)

PARENT_ENV = "TREEGRAFT_PIPELINE_RUN"
KIND, KEY, STAGE, OVERLAY = "pipeline.kind", "pipeline.key", "pipeline.stage", "pipeline.overlay"
PARAMS_HASH, DATA_HASH, DATA_INPUTS = "params.hash", "data.hash", "data.inputs"
GIT_REVISION, GIT_DIRTY = "git.revision", "git.dirty"
CODE_DIGEST, CODE_DIRTY = "code.digest", "code.dirty"  # pipeline/provenance.py code_digest


TRACKING_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable: a user's server or store wins
# The UI opens a model-training experiment on its runs, not on the GenAI overview ("Traces 0").
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def tracking_uri(p: MlflowParams) -> str:
    """``MLFLOW_TRACKING_URI`` when set, else the local SQLite store of ``params.mlflow``."""
    return os.environ.get(TRACKING_ENV) or f"sqlite:///{resolve(p.db)}"


def artifact_root(p: MlflowParams) -> Path:
    """Run artifacts (plots, tables) go to ``mlruns/`` beside the SQLite file."""
    return resolve(p.db).parent / "mlruns"


def open_store(p: MlflowParams) -> tuple[Any, str]:
    """(MlflowClient, experiment id) of the configured store; the experiment is created if missing."""
    import mlflow

    uri = tracking_uri(p)
    users = os.environ.get(TRACKING_ENV)
    mlflow.set_tracking_uri(uri)
    # MLflow also exports the URI for child processes; put the user's setting back, so that a later
    # store of other params (a test's, a child's) is not mistaken for one the user chose.
    if users is None:
        os.environ.pop(TRACKING_ENV, None)
    else:
        os.environ[TRACKING_ENV] = users
    exp = mlflow.get_experiment_by_name(p.experiment)
    if exp is None:
        # Artifacts live next to the database, not in ./mlruns of whatever the working directory is.
        exp_id = mlflow.create_experiment(
            p.experiment, artifact_location=artifact_root(p).as_uri(), tags=EXPERIMENT_KIND
        )
    else:
        exp_id = exp.experiment_id
    client = mlflow.MlflowClient(uri)
    if exp is not None and any(exp.tags.get(k) != v for k, v in EXPERIMENT_KIND.items()):
        for key, value in EXPERIMENT_KIND.items():  # a store made before the kind was set
            client.set_experiment_tag(exp_id, key, value)
    return client, exp_id


def _git_tags(git: GitState) -> dict[str, str]:
    return {
        GIT_REVISION: git.revision,
        GIT_DIRTY: str(git.dirty).lower(),
        "mlflow.source.git.commit": git.revision,
    }


def _log_params(client: Any, run_id: str, values: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)) for k, v in sorted(values.items())]
    for i in range(0, len(items), 100):  # the store's batch limit
        client.log_batch(run_id, params=items[i : i + 100])


@dataclasses.dataclass(frozen=True)
class PipelineIdentity:
    """What groups stage runs into one pipeline run when no parent id is passed down."""

    overlay: str
    values: dict[str, Any]  # every param of params.yaml + overlay, flattened (mlflow excluded)
    params_hash: str
    git: GitState
    key: str


def pipeline_identity(overlay: str) -> PipelineIdentity:
    values = pipeline_values(load_params(profile=overlay))
    p_hash, git = json_sha256(values), git_state()
    # Not the dirty diff: editing a file while a pipeline runs must not split its stages apart.
    key = json_sha256({"params": p_hash, "revision": git.revision})
    return PipelineIdentity(overlay, values, p_hash, git, key)


def create_pipeline_run(client: Any, exp_id: str, ident: PipelineIdentity, finished: bool) -> str:
    """A parent run named ``<overlay> @ <revision>`` with every param logged; returns its id."""
    dirty = "+dirty" if ident.git.dirty else ""
    code = code_digest()
    tags = {
        KIND: "pipeline",
        KEY: ident.key,
        OVERLAY: ident.overlay,
        PARAMS_HASH: ident.params_hash,
        CODE_DIGEST: code or "unknown",
        CODE_DIRTY: str(code is None or code != commit_code_digest(ident.git.revision)).lower(),
        **_git_tags(ident.git),
    }
    run = client.create_run(exp_id, run_name=f"{ident.overlay} @ {ident.git.revision[:8]}{dirty}", tags=tags)
    _log_params(client, run.info.run_id, ident.values)
    if finished:  # created by a stage outside `make repro`: nobody will close it later
        client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def parent_run(client: Any, exp_id: str, overlay: str) -> str:
    """The pipeline run a stage belongs to: TREEGRAFT_PIPELINE_RUN, else found or made by key."""
    from mlflow.exceptions import MlflowException

    given = os.environ.get(PARENT_ENV)
    if given:
        try:
            run = client.get_run(given)
            if run.info.experiment_id == exp_id and run.info.lifecycle_stage == "active":
                return given
        except MlflowException:
            pass
        log.warning("%s=%s is not a live run of this experiment: grouping by key instead", PARENT_ENV, given)
    ident = pipeline_identity(overlay)
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{KIND}` = 'pipeline' and tags.`{KEY}` = '{ident.key}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0].info.run_id if found else create_pipeline_run(client, exp_id, ident, finished=True)


def _copy_metrics_to_parent(client: Any, run_id: str, parent_id: str, stage: str) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"{stage}/{k}", v, now, 0) for k, v in client.get_run(run_id).data.metrics.items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(parent_id, metrics=metrics[i : i + 1000])


@contextmanager
def stage_run(stage: str, params: Params) -> Iterator[Any]:
    """The stage's MLflow run, a child of the pipeline run, with its params and tags; yields the run.
    When the stage ends, its metrics are copied onto the pipeline run and that run's headline is
    logged again from them, so a pipeline run no ``make repro`` closes (a ``dvc exp run``'s) has its
    headline too."""
    import mlflow

    client, exp_id = open_store(params.mlflow)
    values = declared_values(stage, params)
    inputs = stage_inputs(stage, params)
    parent = parent_run(client, exp_id, params.overlay)
    tags = {
        KIND: "stage",
        STAGE: stage,
        OVERLAY: params.overlay,
        PARAMS_HASH: json_sha256(values),
        DATA_HASH: data_hash(inputs),
        DATA_INPUTS: ",".join(_shown(p) for p in inputs),
        CODE_DIGEST: code_digest() or "unknown",  # what the stage's process imports, checked by make results
        **_git_tags(git_state()),
    }
    t0 = time.perf_counter()
    with mlflow.start_run(experiment_id=exp_id, run_name=stage, parent_run_id=parent, tags=tags) as run:
        _log_params(client, run.info.run_id, values)
        yield run
        mlflow.log_metric("stage_seconds", time.perf_counter() - t0)
    _copy_metrics_to_parent(client, run.info.run_id, parent, stage)
    log_headline(client, parent)


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def log_curves(curves: Mapping[str, Any]) -> None:
    """Each fit's learning curve (models.training.Curve) in the active run: metric histories
    ``<fit>/train_loss`` and ``<fit>/val_loss`` (where finite), one step per epoch."""
    import math

    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    rows = [
        Metric(f"{fit}/{name}", float(v), now, int(epoch))
        for fit, c in curves.items()
        for name, values in (("train_loss", c.train_loss), ("val_loss", c.val_loss))
        for epoch, v in zip(c.epochs, values, strict=True)
        if math.isfinite(v)
    ]
    run_id = mlflow.active_run().info.run_id
    client = mlflow.MlflowClient()
    for i in range(0, len(rows), 1000):  # MLflow takes at most 1000 metrics a batch
        client.log_batch(run_id, metrics=rows[i : i + 1000])


def log_metrics(metrics: Mapping[str, Any]) -> None:
    """Log every finite number of a (nested) metrics mapping, keys flattened with '.'."""
    import math

    import mlflow

    flat = {
        k: float(v)
        for k, v in flatten(metrics).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    mlflow.log_metrics({k: v for k, v in flat.items() if math.isfinite(v)})


def log_files(paths: Sequence[Path]) -> None:
    """Log files (tables, JSON) as artifacts of the active run."""
    import mlflow

    for path in paths:
        mlflow.log_artifact(str(path))


def log_figure(fig: Any, name: str) -> None:
    """Log a matplotlib figure as a run artifact (plots/<name>) and close it."""
    import matplotlib.pyplot as plt
    import mlflow

    fig.tight_layout()
    mlflow.log_figure(fig, f"plots/{name}")
    plt.close(fig)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows with identical keys (in order) to CSV; floats as repr, so DVC plots read them back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def start_pipeline(params: Params) -> str:
    """Create a RUNNING parent run for a pipeline run (``make repro``); returns its id."""
    client, exp_id = open_store(params.mlflow)
    return create_pipeline_run(client, exp_id, pipeline_identity(params.overlay), finished=False)


def end_pipeline(params: Params, run_id: str, returncode: int) -> bool:
    """Close a parent run (FAILED if dvc failed); delete it if no stage ran. True if kept."""
    client, exp_id = open_store(params.mlflow)
    children = client.search_runs(
        [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'", max_results=1
    )
    if not children:
        client.delete_run(run_id)  # every stage was up to date: an empty parent is only clutter
        return False
    log_headline(client, run_id)
    client.set_terminated(run_id, "FINISHED" if returncode == 0 else "FAILED")
    return True


def log_headline(client: Any, run_id: str) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    figures = headline_metrics(client.get_run(run_id).data.metrics)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in figures.items()])


def ui_links(params: Params, port: str) -> list[str]:
    """The experiment's runs, then per overlay with two pipeline runs or more a side-by-side page
    of its two newest, then the newest pipeline run of each overlay side by side."""
    client, exp_id = open_store(params.mlflow)
    base = f"http://127.0.0.1:{port}/#"
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{KIND}` = 'pipeline'",
        order_by=["attributes.start_time DESC"],
        max_results=200,
    )
    by_overlay: dict[str, list[str]] = {}
    for run in runs:
        by_overlay.setdefault(run.data.tags.get(OVERLAY, ""), []).append(run.info.run_id)

    def compare(ids: list[str]) -> str:
        return f'{base}/compare-runs?runs={json.dumps(ids).replace(" ", "")}&experiments=["{exp_id}"]'

    links = [f"{base}/experiments/{exp_id}/runs"]
    links += [compare(ids[:2]) for ids in by_overlay.values() if len(ids) >= 2]
    if len(by_overlay) >= 2:
        links.append(compare([ids[0] for ids in by_overlay.values()][:4]))
    return links


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tracking")
    parser.add_argument(
        "--profile", default=None, help="profiles/<name>.yaml overlay (default: params.yaml's)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="create a pipeline (parent) run and print its id")
    end = sub.add_parser("end", help="close a pipeline run (delete it if no stage ran)")
    end.add_argument("run_id")
    end.add_argument("returncode", type=int, nargs="?", default=0)
    ui = sub.add_parser("ui", help="serve the MLflow UI on 127.0.0.1")
    ui.add_argument("--port", default="5000")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING)
    params = load_params(profile=args.profile)
    if args.command == "start":
        print(start_pipeline(params))
        return 0
    if args.command == "end":
        kept = end_pipeline(params, args.run_id, args.returncode)
        print(
            f"pipeline run {args.run_id}: " + ("closed" if kept else "no stage ran, removed"), file=sys.stderr
        )
        return 0
    uri = tracking_uri(params.mlflow)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    print(f"MLflow UI for {uri}:")
    for link in ui_links(params, args.port):
        print(f"  {link}")
    return subprocess.call([*cmd, "--port", args.port, "--workers", "1"], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
