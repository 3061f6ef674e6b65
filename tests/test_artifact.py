"""Tampered or malformed scheduler artifacts are refused, each with an error naming file and field."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from decoder.core.state import state_feature_names
from decoder.deploy.artifact import (
    CHECKSUM_FIELD,
    FIELDS,
    ManifestError,
    build_manifest,
    manifest_digest,
    read_artifact,
    write_artifact,
)
from decoder.deploy.planning import HEADS, suffix_feature_names
from decoder.deploy.scheduler import load_scheduler

SIGNALS = ("frontier_mean_depth", "frontier_leaf_ratio", "preview_collapse_debt", "preview_history_share",
           "preview_overlap_ratio", "preview_mean_score")  # fmt: skip
NAMES = state_feature_names(5, SIGNALS)
N = len(NAMES)


def _arrays(head: str, sizes: list[int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        out[f"{head}.{i}.weight"], out[f"{head}.{i}.bias"] = rng.normal(size=(b, a)), rng.normal(size=b)
    return out


def _student(path: Path, seed: int = 0) -> Path:
    manifest = build_manifest(
        kind="student", depth=5, width=10, feature_names=NAMES, input_names=NAMES,
        x_mean=np.linspace(-1, 1, N), x_std=np.linspace(0.5, 2, N), heads={"margin": [N, 8, 1]},
        y_mean={"margin": 0.25}, y_std={"margin": 2.0}, signals=list(SIGNALS), git_revision="abc",
        metrics={"oof_margin_mae": 0.5},
    )  # fmt: skip
    return write_artifact(path, manifest, _arrays("margin", [N, 8, 1], seed))


def _edit(path: Path, **fields: object) -> None:
    """Rewrite manifest fields in place, leaving the checksums as they were (a hand edit)."""
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta, indent=2))


def _refused(path: Path, field: str, detail: str = "") -> str:
    with pytest.raises(ManifestError) as err:
        read_artifact(path, "student")
    msg = str(err.value)
    assert msg.startswith(str(path)), msg
    assert f"'{field}'" in msg, msg
    assert re.search(detail, msg), msg
    return msg


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = _student(tmp_path / "scheduler")
    read_artifact(path, "student")  # the untouched artifact loads
    return path


def test_x_std_zero(good: Path) -> None:
    meta = json.loads(good.read_text())
    _edit(good, x_std=[0.0, *meta["x_std"][1:]])
    _refused(good, "x_std", r"entry 0 \(log_prompt_tokens\) must be > 0")


def test_x_std_nan(good: Path) -> None:
    meta = json.loads(good.read_text())
    _edit(good, x_std=[*meta["x_std"][:3], float("nan"), *meta["x_std"][4:]])
    assert "NaN" in good.read_text()
    _refused(good, "x_std", "entry 3 .* must be a finite number")


def test_negated_y_std(good: Path) -> None:
    _edit(good, y_std={"margin": -2.0})
    _refused(good, "y_std", "head 'margin' must be > 0")


def test_unknown_activation(good: Path) -> None:
    _edit(good, activation="tanh")
    _refused(good, "activation", "'tanh' is not one this decoder computes")


def test_missing_key(good: Path) -> None:
    meta = json.loads(good.read_text())
    del meta["x_mean"]
    good.write_text(json.dumps(meta))
    _refused(good, "x_mean", "missing field")


def test_bad_json(good: Path) -> None:
    good.write_text(good.read_text()[:-40])
    with pytest.raises(ManifestError, match=rf"^{re.escape(str(good))}: not valid JSON \(.* line \d+ column"):
        read_artifact(good, "student")


def test_edited_feature_order_breaks_the_manifest_checksum(good: Path) -> None:
    swapped = [*NAMES[:-2], NAMES[-1], NAMES[-2]]
    _edit(good, feature_names=swapped, input_names=swapped, signals=swapped[-6:])
    _refused(good, CHECKSUM_FIELD, "edited after it was written")


def test_any_edited_number_breaks_the_manifest_checksum(good: Path) -> None:
    meta = json.loads(good.read_text())
    _edit(good, y_mean={"margin": 0.26})  # valid, only different
    _refused(good, CHECKSUM_FIELD)
    _edit(good, y_mean=meta["y_mean"], metrics={"oof_margin_mae": 0.1})
    _refused(good, CHECKSUM_FIELD)


def test_swapped_weights(good: Path, tmp_path: Path) -> None:
    other = _student(tmp_path / "other", seed=1)  # same shapes, different values
    shutil.copy(other.with_suffix(".safetensors"), good.with_suffix(".safetensors"))
    _refused(good, "weights_sha256", re.escape(str(good.with_suffix(".safetensors"))))
    # re-pointing weights_sha256 at the swapped file is an edit of the manifest
    _edit(good, weights_sha256=json.loads(other.read_text())["weights_sha256"])
    _refused(good, CHECKSUM_FIELD)


def test_checks_do_not_rely_on_the_checksum(good: Path) -> None:
    """A re-signed bad manifest (or a producer's bug) still fails on the field itself."""
    meta = json.loads(good.read_text())
    meta["y_std"] = {"margin": -2.0}
    meta[CHECKSUM_FIELD] = manifest_digest(meta)
    good.write_text(json.dumps(meta))
    _refused(good, "y_std", "must be > 0")
    fields = {k: v for k, v in meta.items() if k not in ("schema_version", "weights_sha256", CHECKSUM_FIELD)}
    arrays = read_artifact(_student(good.parent / "again"), "student").arrays
    with pytest.raises(ManifestError, match="field 'x_std'"):
        write_artifact(good.parent / "bad", {**fields, "y_std": {"margin": 2.0}, "x_std": [0.0] * N}, arrays)
    assert not (good.parent / "bad.json").exists() and not (good.parent / "bad.safetensors").exists()


@pytest.mark.parametrize(
    ("fields", "field", "detail"),
    [
        ({"depth": 5.0}, "depth", "integer"),
        ({"depth": True}, "depth", "integer"),
        ({"width": 0}, "width", ">= 1"),
        ({"x_mean": [0.0] * (N - 1)}, "x_mean", f"list of {N} numbers"),
        ({"x_mean": ["0"] * N}, "x_mean", "finite number"),
        ({"heads": {"margin": [N, 8, 2]}}, "heads", "do not map"),
        ({"heads": {"margin": [N, 8.5, 1]}}, "heads", "positive integers"),
        ({"heads": {}}, "heads", "must map"),
        ({"y_mean": {"other": 0.0}}, "y_mean", "one number per head"),
        ({"feature_names": [*NAMES[:-1], NAMES[0]]}, "feature_names", "repeats"),
        ({"input_names": list(NAMES[:-1])}, "input_names", "must start with feature_names"),
        ({"signals": ["frontier_mean_depth"]}, "signals", "must be the last feature_names"),
        ({"kind": "critic"}, "kind", "must be one of"),
        ({"schema_version": "treegraft-mlp/1"}, "schema_version", "this decoder reads"),
        ({"targets": "A"}, "targets", "not part of a student"),
        ({"surprise": 1}, "surprise", "unknown field"),
    ],
)
def test_malformed_fields(good: Path, fields: dict, field: str, detail: str) -> None:
    _edit(good, **fields)
    _refused(good, field, detail)


def test_tensors_must_match_the_heads(good: Path) -> None:
    meta = json.loads(good.read_text())
    arrays = read_artifact(good, "student").arrays
    fields = {k: v for k, v in meta.items() if k not in ("schema_version", "weights_sha256", CHECKSUM_FIELD)}
    weights = str(good.parent / "t.safetensors")
    cases = [
        ({**arrays, "margin.0.weight": arrays["margin.0.weight"][:, :-1]}, "'margin.0.weight' has shape"),
        ({k: v for k, v in arrays.items() if k != "margin.1.bias"}, "'margin.1.bias' missing"),
        ({**arrays, "margin.2.weight": np.ones((1, 1))}, "not layers of the manifest's heads"),
        ({**arrays, "margin.1.bias": np.array([np.inf])}, "'margin.1.bias' has non-finite values"),
    ]
    for bad, detail in cases:
        with pytest.raises(ManifestError, match=rf"^{re.escape(weights)}: tensor.*{re.escape(detail)}"):
            write_artifact(good.parent / "t", fields, bad)


def test_value_artifact_round_trips_and_every_field_is_declared(tmp_path: Path) -> None:
    n_in = N + 6
    manifest = build_manifest(
        kind="value", depth=5, width=10, feature_names=NAMES, input_names=[*NAMES, *suffix_feature_names(5)],
        x_mean=np.zeros(n_in), x_std=np.ones(n_in), heads={h: [n_in, 4, 1] for h in HEADS},
        y_mean=dict.fromkeys(HEADS, 1.0), y_std=dict.fromkeys(HEADS, 0.5), targets="A, logt",
    )  # fmt: skip
    arrays = {k: v for i, h in enumerate(HEADS) for k, v in _arrays(h, [n_in, 4, 1], i).items()}
    art = read_artifact(write_artifact(tmp_path / "value", manifest, arrays), "value")
    assert art.manifest["targets"] == "A, logt" and set(art.manifest) <= set(FIELDS)
    with pytest.raises(ManifestError, match="field 'kind': 'value', expected 'student'"):
        load_scheduler(tmp_path / "value")
