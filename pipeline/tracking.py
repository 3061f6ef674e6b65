"""MLflow and file helpers shared by the learning stages (one stage = one run named after it).

Contract: :func:`stage_run` points MLflow at the local SQLite store of ``params.mlflow`` (telemetry
off; run artifacts in ``mlruns/`` beside the database), opens a run named after the stage, logs the
stage's params section flattened (``train.lr``), and closes the run (FAILED if the stage raised).
Plots go through :func:`log_figure` (matplotlib, Agg backend). Metrics files are nested JSON for
``dvc metrics show``; plot data are CSV for ``dvc plots``.

CLI: ``python -m pipeline.tracking ui`` starts the MLflow UI on 127.0.0.1 (one worker, no job
execution) on the configured store.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from config.params import ROOT, MlflowParams, Params, resolve

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def tracking_uri(p: MlflowParams) -> str:
    return f"sqlite:///{resolve(p.db)}"


def artifact_root(p: MlflowParams) -> Path:
    """Run artifacts (plots, tables) go to ``mlruns/`` beside the SQLite file."""
    return resolve(p.db).parent / "mlruns"


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dataclasses/mappings -> {'a.b': value}; tuples become comma-joined strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list | tuple):
        obj = ",".join(map(str, obj))
    return {prefix[:-1]: obj}


@contextmanager
def stage_run(stage: str, params: Params) -> Iterator[Any]:
    """An MLflow run named ``stage`` with the stage's params section logged; yields the run."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(params.mlflow))
    name = params.mlflow.experiment
    if mlflow.get_experiment_by_name(name) is None:
        # Artifacts live next to the database, not in ./mlruns of whatever the working directory is.
        mlflow.create_experiment(name, artifact_location=artifact_root(params.mlflow).as_uri())
    mlflow.set_experiment(name)
    with mlflow.start_run(run_name=stage) as run:
        mlflow.log_params({**flatten(getattr(params, stage)), "tree.depth": params.tree.depth})
        yield run


def lightning_logger(params: Params, run: Any) -> Any:
    """Lightning's MLflow logger writing into the stage's open run (learning curves per epoch)."""
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(
        params.mlflow.experiment, tracking_uri=tracking_uri(params.mlflow), run_id=run.info.run_id
    )


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


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_revision() -> str:
    """``git rev-parse HEAD`` of the repository, or "unknown" outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """``ui``: serve the MLflow UI of params.yaml's store on 127.0.0.1."""
    from config.params import load_params

    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["ui"]:
        print("usage: python -m pipeline.tracking ui [--port N] [--profile NAME]")
        return 2
    port = args[args.index("--port") + 1] if "--port" in args else "5000"
    profile = args[args.index("--profile") + 1] if "--profile" in args else None
    uri = tracking_uri(load_params(profile=profile).mlflow)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    print(f"MLflow UI for {uri} on http://127.0.0.1:{port}")
    return subprocess.call([*cmd, "--port", port, "--workers", "1"], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
