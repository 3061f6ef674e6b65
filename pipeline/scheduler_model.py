"""The exported scheduler as an MLflow pyfunc model (NumPy student, no torch, no pickle).

This file is also the model's code: :func:`log_scheduler_model` logs it "from code" with the
artifact pair (scheduler.json + scheduler.safetensors) and ``decoder/`` as code, so
``mlflow.pyfunc.load_model(uri).predict(frame)`` runs decoder.deploy.scheduler's own loader (every manifest
check included) and its NumPy network. Input signature: one double column per state feature, in the
manifest's order; output: ``margin`` (predicted, manifest units) and ``invoke`` (the scheduler's
own decision).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types import ColSpec, Schema

from decoder.deploy.artifact import artifact_paths
from decoder.deploy.scheduler import load_scheduler

MODEL_NAME = "scheduler"
MANIFEST_KEY, WEIGHTS_KEY = "manifest", "weights"
# Manifest fields copied into the MLmodel metadata (shown by the UI next to the signature).
METADATA_FIELDS = (
    "schema_version",
    "kind",
    "depth",
    "width",
    "signals",
    "margin_units",
    "threshold",
    "skip_rest_below",
    "skip_rest_max_target_ms",
    "skip_rounds_max",
    "skip_rounds_margin",
    "weights_sha256",
    "manifest_sha256",
    "training_data_sha256",
    "git_revision",
)


class SchedulerModel(PythonModel):
    """Predicts the student's margin (and the invoke decision) for a frame of state vectors."""

    def load_context(self, context: Any) -> None:
        self.scheduler = load_scheduler(context.artifacts[MANIFEST_KEY])
        self.features = list(self.scheduler.manifest["feature_names"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> pd.DataFrame:
        # Row by row through the scheduler's own margin/decide, so the decision rule (threshold
        # included) is the decoder's, not a copy of it.
        z = np.asarray(model_input[self.features], dtype=np.float64)
        margin = [self.scheduler.margin(row) for row in z]
        invoke = [self.scheduler.decide(row) for row in z]
        return pd.DataFrame(
            {"margin": np.array(margin, dtype=np.float64), "invoke": np.array(invoke, dtype=bool)}
        )


def scheduler_signature(manifest: dict) -> ModelSignature:
    inputs = Schema([ColSpec("double", name) for name in manifest["feature_names"]])
    outputs = Schema([ColSpec("double", "margin"), ColSpec("boolean", "invoke")])
    return ModelSignature(inputs=inputs, outputs=outputs)


def log_scheduler_model(path: Path | str) -> Any:
    """Log the exported scheduler at ``path`` (json, safetensors or stem) as a model of the open run.

    Returns mlflow's ModelInfo (``model_uri`` loads it back). Requirements are given, not inferred:
    inference would load the model in a subprocess, seconds that export does not need to spend.
    """
    manifest_path, weights_path = artifact_paths(path)
    scheduler = load_scheduler(manifest_path)  # refuse to publish what the decoder would refuse
    manifest = scheduler.manifest
    features = list(manifest["feature_names"])
    decoder_dir = Path(__file__).resolve().parents[1] / "decoder"
    return mlflow.pyfunc.log_model(
        name=MODEL_NAME,
        python_model=Path(__file__).resolve(),
        artifacts={MANIFEST_KEY: str(manifest_path), WEIGHTS_KEY: str(weights_path)},
        code_paths=[str(decoder_dir)],
        signature=scheduler_signature(manifest),
        # The training mean as one example row (logging checks that the model serves it).
        input_example=pd.DataFrame([manifest["x_mean"][: len(features)]], columns=features),
        pip_requirements=[
            f"numpy=={np.__version__}",
            f"pandas=={pd.__version__}",
            f"safetensors=={version('safetensors')}",
        ],
        metadata={k: manifest[k] for k in METADATA_FIELDS if k in manifest},
    )


mlflow.models.set_model(SchedulerModel())
