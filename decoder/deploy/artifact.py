"""Scheduler artifacts on disk: writing, reading and checking every field (NumPy only, no pickle).

An artifact is ``NAME.safetensors`` (float32 tensors ``{head}.{i}.weight`` (out, in) and
``{head}.{i}.bias``; ReLU between layers) plus ``NAME.json``, the manifest. Its fields are the
table :data:`FIELDS`: schema_version, kind ("student" | "value"), depth D, width W, feature_names
(the state z, in order), input_names (z plus the suffix encoding for a value system), x_mean/x_std
over the inputs, activation, heads (name -> layer widths), y_mean/y_std per head,
weights_sha256, manifest_sha256, and optional provenance (signals, training_data_sha256,
git_revision, metrics, units).

Contract: :func:`read_artifact` refuses, with a :class:`ManifestError` naming the file and the
field, a file that is not JSON, a missing or unknown field, a wrong type, length or shape, a value
that is not finite, x_std or y_std <= 0, an unknown activation, malformed heads, tensors that do
not match the heads, and any edit after writing: ``weights_sha256`` pins the weights file and
``manifest_sha256`` pins the canonical JSON of every other manifest field (weights hash
included), so changing one number anywhere is caught. :func:`write_artifact` runs the same checks
before it writes, and writes each file to a temporary name, fsyncs and renames it.

Adding a field is one entry in :data:`FIELDS` (a check, whether it is required, which kinds carry
it, and a default that the reader fills in when an optional field is absent).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from decoder.io.files import replace_atomically

SCHEMA_VERSION = "treegraft-mlp/2"  # /2: manifest_sha256 over the manifest and weights together
KINDS = ("student", "value")
ACTIVATIONS = ("relu",)
CHECKSUM_FIELD = "manifest_sha256"
WRITER_FIELDS = ("schema_version", "weights_sha256", CHECKSUM_FIELD)  # set by write_artifact only
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """An exported scheduler artifact does not fit this decoder (or is corrupt)."""


class _Invalid(ValueError):
    """A field's value is wrong; the reader adds the file and the field's name."""


@dataclass(frozen=True)
class Artifact:
    manifest: dict
    arrays: dict[str, np.ndarray]


_NO_DEFAULT = object()


@dataclass(frozen=True)
class Field:
    """One manifest field: ``check(value, manifest)`` raises _Invalid; earlier fields are valid."""

    check: Callable[[Any, Mapping[str, Any]], None]
    required: bool = True
    kinds: tuple[str, ...] = KINDS
    default: Any = _NO_DEFAULT


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int_at_least(low: int) -> Callable[[Any, Mapping[str, Any]], None]:
    def check(v: Any, _: Mapping[str, Any]) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _Invalid(f"must be an integer >= {low}, got {v!r}")

    return check


def _finite(v: Any, what: str = "value") -> float:
    if not _is_number(v) or not math.isfinite(v):
        raise _Invalid(f"{what} must be a finite number, got {v!r}")
    return float(v)


def _finite_number(v: Any, _: Mapping[str, Any]) -> None:
    _finite(v)


def _non_negative(v: Any, _: Mapping[str, Any]) -> None:
    if _finite(v) < 0:
        raise _Invalid(f"must be >= 0, got {v!r}")


def _positive(v: Any, _: Mapping[str, Any]) -> None:
    if _finite(v) <= 0:
        raise _Invalid(f"must be > 0, got {v!r}")


def _string(v: Any, _: Mapping[str, Any]) -> None:
    if not isinstance(v, str):
        raise _Invalid(f"must be a string, got {v!r}")


def _hex_digest(v: Any, _: Mapping[str, Any]) -> None:
    if not isinstance(v, str) or not _HEX64.fullmatch(v):
        raise _Invalid(f"must be 64 lowercase hex digits, got {v!r}")


def _names(v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise _Invalid(f"must be a list of non-empty strings, got {v!r}")
    if len(set(v)) != len(v):
        raise _Invalid(f"repeats a name: {v}")
    return v


def _schema_version(v: Any, _: Mapping[str, Any]) -> None:
    if v != SCHEMA_VERSION:
        raise _Invalid(f"{v!r}, this decoder reads {SCHEMA_VERSION!r}")


def _kind(v: Any, _: Mapping[str, Any]) -> None:
    if v not in KINDS:
        raise _Invalid(f"must be one of {list(KINDS)}, got {v!r}")


def _feature_names(v: Any, _: Mapping[str, Any]) -> None:
    if not _names(v):
        raise _Invalid("is empty")


def _input_names(v: Any, m: Mapping[str, Any]) -> None:
    features = m["feature_names"]
    if _names(v)[: len(features)] != features:
        raise _Invalid(f"must start with feature_names {features}, got {v}")


def _per_input(positive: bool) -> Callable[[Any, Mapping[str, Any]], None]:
    def check(v: Any, m: Mapping[str, Any]) -> None:
        n_in = len(m["input_names"])
        if not isinstance(v, list) or len(v) != n_in:
            raise _Invalid(f"must be a list of {n_in} numbers (one per input), got {v!r}")
        for i, x in enumerate(v):
            if _finite(x, f"entry {i} ({m['input_names'][i]})") <= 0 and positive:
                raise _Invalid(f"entry {i} ({m['input_names'][i]}) must be > 0, got {x!r}")

    return check


def _activation(v: Any, _: Mapping[str, Any]) -> None:
    if v not in ACTIVATIONS:
        raise _Invalid(f"{v!r} is not one this decoder computes ({list(ACTIVATIONS)})")


def _heads(v: Any, m: Mapping[str, Any]) -> None:
    n_in = len(m["input_names"])
    if not isinstance(v, dict) or not v:
        raise _Invalid(f"must map head names to layer widths, got {v!r}")
    for head, sizes in v.items():
        if not head or not isinstance(sizes, list) or len(sizes) < 2:
            raise _Invalid(f"head {head!r}: need a list of at least 2 layer widths, got {sizes!r}")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise _Invalid(f"head {head!r}: widths must be positive integers, got {sizes}")
        if sizes[0] != n_in or sizes[-1] != 1:
            raise _Invalid(f"head {head!r}: sizes {sizes} do not map {n_in} inputs to 1 output")


def _per_head(positive: bool) -> Callable[[Any, Mapping[str, Any]], None]:
    def check(v: Any, m: Mapping[str, Any]) -> None:
        heads = list(m["heads"])
        if not isinstance(v, dict) or sorted(v) != sorted(heads):
            raise _Invalid(f"must have one number per head {heads}, got {v!r}")
        for head in heads:
            if _finite(v[head], f"head {head!r}") <= 0 and positive:
                raise _Invalid(f"head {head!r} must be > 0, got {v[head]!r}")

    return check


def _signals(v: Any, m: Mapping[str, Any]) -> None:
    names = _names(v)
    if names and m["feature_names"][-len(names) :] != names:
        raise _Invalid(f"{names} must be the last feature_names {m['feature_names']}")


def _metrics(v: Any, _: Mapping[str, Any]) -> None:
    if not isinstance(v, dict):
        raise _Invalid(f"must be a mapping, got {v!r}")


# Checked in this order: a check may read the fields above it (they are valid by then).
FIELDS: dict[str, Field] = {
    "schema_version": Field(_schema_version),
    "kind": Field(_kind),
    "depth": Field(_int_at_least(1)),
    "width": Field(_int_at_least(1)),
    "feature_names": Field(_feature_names),
    "input_names": Field(_input_names),
    "x_mean": Field(_per_input(positive=False)),
    "x_std": Field(_per_input(positive=True)),
    "activation": Field(_activation),
    "heads": Field(_heads),
    "y_mean": Field(_per_head(positive=False)),
    "y_std": Field(_per_head(positive=True)),
    "weights_sha256": Field(_hex_digest),
    CHECKSUM_FIELD: Field(_hex_digest),
    "signals": Field(_signals, required=False),
    "training_data_sha256": Field(_hex_digest, required=False),
    "git_revision": Field(_string, required=False),
    "metrics": Field(_metrics, required=False),
    "margin_source": Field(_string, required=False, kinds=("student",)),
    "margin_units": Field(_string, required=False, kinds=("student",)),
    "decision": Field(_string, required=False, kinds=("student",)),
    # invoke iff the predicted margin > threshold (margin_units); chosen out of fold by distill
    "threshold": Field(_finite_number, required=False, kinds=("student",), default=0.0),
    # skip the rest of a round, without deciding, once the margin is < threshold - this (>= 0);
    # absent: decide every step. Chosen out of fold by distill (decision-priced round walk)
    "skip_rest_below": Field(_non_negative, required=False, kinds=("student",)),
    # the gate applies only where the runtime context's target_ms (the pair's verify of a full tree)
    # is at most this (> 0): it saves decision time, which counts only where a round is cheap;
    # absent: at any target_ms. Chosen with skip_rest_below by distill
    "skip_rest_max_target_ms": Field(_positive, required=False, kinds=("student",)),
    # cross-round backoff cap c (an integer >= 0): after k idle deciding rounds in a row (no mid
    # call), skip the next min(2^k - 1, c) rounds without deciding; absent or 0: decide every round.
    # Chosen out of fold by distill (decision-priced walk with the backoff carried start to start)
    "skip_rounds_max": Field(_int_at_least(0), required=False, kinds=("student",)),
    # the backoff's idle margin h (>= 0): a round is idle only if no decided margin came within h of
    # the threshold; absent: 0 (idle = no mid call). Chosen with skip_rounds_max by distill
    "skip_rounds_margin": Field(_non_negative, required=False, kinds=("student",)),
    "targets": Field(_string, required=False, kinds=("value",)),
}


def artifact_paths(path: Path | str) -> tuple[Path, Path]:
    """(manifest .json, weights .safetensors) for a path to either file or to the common stem."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".json", ".safetensors") else p
    return stem.with_suffix(".json"), stem.with_suffix(".safetensors")


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of every field but manifest_sha256 (key order kept)."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_FIELD}
    return hashlib.sha256(json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def validate_manifest(manifest: Any, where: str) -> dict:
    """Check every field of a parsed manifest; returns it with optional defaults filled in."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
    if "schema_version" in manifest:  # a version mismatch explains any other difference
        _check_field(where, "schema_version", manifest)
    unknown = [k for k in manifest if k not in FIELDS]
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {unknown}; known: {list(FIELDS)}")
    out = dict(manifest)
    for name, field in FIELDS.items():
        carried = name in ("schema_version", "kind") or manifest["kind"] in field.kinds
        if name not in manifest:
            if field.required and carried:
                raise ManifestError(f"{where}: missing field {name!r}")
            if field.default is not _NO_DEFAULT and carried:
                out[name] = field.default
        elif not carried:
            raise ManifestError(f"{where}: field {name!r} is not part of a {manifest['kind']} artifact")
        else:
            _check_field(where, name, manifest)
    return out


def _check_field(where: str, name: str, manifest: Mapping[str, Any]) -> None:
    try:
        FIELDS[name].check(manifest[name], manifest)
    except _Invalid as err:
        raise ManifestError(f"{where}: field {name!r}: {err}") from None


def check_arrays(manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray], where: str) -> None:
    """The tensors are exactly the heads' layers, with the declared shapes and finite values."""
    expected: dict[str, tuple[int, ...]] = {}
    for head, sizes in manifest["heads"].items():
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            expected[f"{head}.{i}.weight"], expected[f"{head}.{i}.bias"] = (b, a), (b,)
    extra = sorted(set(arrays) - set(expected))
    if extra:
        raise ManifestError(f"{where}: tensor(s) {extra} are not layers of the manifest's heads")
    for name, shape in expected.items():
        if name not in arrays:
            raise ManifestError(f"{where}: tensor {name!r} missing (field 'heads' declares it)")
        if tuple(arrays[name].shape) != shape:
            raise ManifestError(f"{where}: tensor {name!r} has shape {arrays[name].shape}, heads say {shape}")
        if not np.all(np.isfinite(arrays[name])):
            raise ManifestError(f"{where}: tensor {name!r} has non-finite values")


def build_manifest(
    *,
    kind: str,
    depth: int,
    width: int,
    feature_names: Sequence[str],
    input_names: Sequence[str],
    x_mean: Sequence[float],
    x_std: Sequence[float],
    heads: dict[str, Sequence[int]],
    y_mean: dict[str, float],
    y_std: dict[str, float],
    **extra: object,
) -> dict:
    """The manifest fields every artifact has (``extra``: provenance, metrics, units, ...)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return {
        "kind": kind,
        "depth": int(depth),
        "width": int(width),
        "feature_names": list(feature_names),
        "input_names": list(input_names),
        "x_mean": [float(v) for v in x_mean],
        "x_std": [float(v) for v in x_std],
        "heads": {h: [int(s) for s in sizes] for h, sizes in heads.items()},
        "activation": "relu",
        "y_mean": {h: float(v) for h, v in y_mean.items()},
        "y_std": {h: float(v) for h, v in y_std.items()},
        **extra,
    }


def write_artifact(path: Path | str, manifest: dict, arrays: dict[str, np.ndarray]) -> Path:
    """Check, then write weights and manifest (adding schema_version and both checksums).

    ``manifest`` must not carry schema_version or the checksums itself. Returns the .json path.
    """
    meta, weights = artifact_paths(path)
    given = [k for k in WRITER_FIELDS if k in manifest]
    if given:
        raise ValueError(f"{meta}: write_artifact sets {given} itself")
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sorted(arrays.items())}
    blob = save(tensors)
    full = {**manifest, "schema_version": SCHEMA_VERSION, "weights_sha256": hashlib.sha256(blob).hexdigest()}
    full = json.loads(json.dumps(full))  # the digest is then the one a reader computes
    full[CHECKSUM_FIELD] = manifest_digest(full)
    validate_manifest(full, str(meta))
    check_arrays(full, tensors, str(weights))
    meta.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(weights, blob)
    replace_atomically(meta, (json.dumps(full, indent=2) + "\n").encode())  # key order kept
    return meta


def _parse(data: bytes, meta: Path) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ManifestError(f"{meta}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ManifestError(
            f"{meta}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None


def read_artifact(path: Path | str, kind: str) -> Artifact:
    """Read and validate an artifact of the given kind; see the module contract."""
    meta, weights = artifact_paths(path)
    if not meta.is_file() or not weights.is_file():
        raise ManifestError(f"{meta.with_suffix('')}: need both {meta.name} and {weights.name}")
    return artifact_from_bytes(meta.read_bytes(), weights.read_bytes(), kind, meta)


def artifact_from_bytes(meta_bytes: bytes, weights_bytes: bytes, kind: str, meta: Path) -> Artifact:
    """Validate an artifact of the given kind from its two files' bytes (module contract), each read
    once by the caller, so the weights hashed are the weights loaded. ``meta`` names the manifest
    file (and, by its stem, the weights file) in errors."""
    weights = artifact_paths(meta)[1]
    where = str(meta)
    raw = _parse(meta_bytes, meta)
    manifest = validate_manifest(raw, where)
    if manifest["kind"] != kind:
        raise ManifestError(f"{where}: field 'kind': {manifest['kind']!r}, expected {kind!r}")
    if raw[CHECKSUM_FIELD] != manifest_digest(raw):
        raise ManifestError(
            f"{where}: field {CHECKSUM_FIELD!r} does not match the manifest's other fields "
            "(the manifest was edited after it was written)"
        )
    if raw["weights_sha256"] != hashlib.sha256(weights_bytes).hexdigest():
        raise ManifestError(f"{where}: field 'weights_sha256' does not match {weights}")
    try:
        arrays = load(weights_bytes)
    except Exception as err:  # safetensors' own error type varies by version
        raise ManifestError(f"{weights}: unreadable safetensors file ({err})") from None
    check_arrays(manifest, arrays, str(weights))
    return Artifact(manifest, arrays)
