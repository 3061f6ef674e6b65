"""A pair's deployment: what it decodes with, as one checked bundle the decoder loads by itself.

A bundle folder holds the exported student (scheduler.json + scheduler.safetensors, as the export
stage writes them), the pair's latency profile (``profile.json``, as the profile stage writes it),
``deployment.json`` and ``checksums.json`` (decoder/deploy/bundle.py). deployment.json
holds the pair check's decision (the student at a threshold offset, or a fallback: All-Small,
All-Mid, AR), the tree and decoding settings the pipeline chose for the pair, the runtime costs the
student's context features read (decoder/deploy/runtime_costs.py), the models it decodes (paths relative
to the bundle folder, dtype, device, nn.Linear kernel, template), the latency profile those costs
came from and provenance (git revision, sha256 of every input).

Contract: :func:`load_deployment` checks every file (bundle.verified_folder), then every field of
deployment.json (a missing, unknown or ill-typed field is one :class:`DeploymentError` naming the
file and the field), then the student like decoder.deploy.scheduler.load_scheduler (manifest, checksums,
feature order, D and W against the bundle's tree) and that the decision's threshold is the
manifest's plus the offset. It returns a :class:`Deployment`: ``generate(pair, ids, d.policy,
d.config, d.runtime(len(ids)))`` decodes as the pipeline's deployed row does;
``decoder.deploy.switch_off.for_deployment(d)`` in place of ``d.policy`` adds the per-request switch-off,
priced with the bundle's profile.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.policies import AR, RuntimeContext, parse_policy, uses_mid
from decoder.deploy.artifact import Artifact, ManifestError, artifact_from_bytes, read_artifact
from decoder.deploy.bundle import (
    DeploymentError,
    PairFolder,
    is_hex_digest,
    is_pair_name,
    parse_json,
    verified_folder,
)
from decoder.deploy.latency import LatencyProfile, profile_from_bytes
from decoder.deploy.runtime_costs import RuntimeCosts
from decoder.deploy.scheduler import LearnedScheduler, check_features, scheduler_from

__all__ = [
    "Deployment",
    "DeploymentError",
    "load_deployment",
    "scheduler_at",
    "threshold_variants",
    "variant_name",
]

SCHEMA_VERSION = "treegraft-deployment/1"
DEPLOYMENT_FILE = "deployment.json"
STUDENT_FILES = ("scheduler.json", "scheduler.safetensors")
PROFILE_FILE = "profile.json"  # the pair's latency profile: the costs and the switch-off's prices
REQUIRED_FILES = (DEPLOYMENT_FILE, *STUDENT_FILES, PROFILE_FILE)
FALLBACKS = ("all-small", "all-mid", AR)  # what a pair deploys when no threshold beats its endpoints


def variant_name(offset: float) -> str:
    """The student at its exported threshold is ``student``; shifted by o, ``student:o`` (2 decimals,
    a sign only when negative: the name is part of MLflow metric keys, which may not hold a '+')."""
    return "student" if offset == 0 else f"student:{offset:.2f}"


def scheduler_at(path: Path, depth: int, width: int, offset: float) -> LearnedScheduler:
    """The exported student at ``path`` (validated as load_scheduler does) with its threshold moved
    by ``offset``; its gate and backoff margins are relative to the threshold, so they move with it."""
    return _shifted(read_artifact(path, "student"), path, depth, width, offset)


def _shifted(art: Artifact, where: Path, depth: int, width: int, offset: float) -> LearnedScheduler:
    """The student ``art`` (checked as load_scheduler checks one) with its threshold moved by ``offset``."""
    scheduler_from(art, where, depth, width)
    signals = check_features(art.manifest, depth, width)
    shifted = {**art.manifest, "threshold": float(art.manifest["threshold"]) + offset}
    return LearnedScheduler(dataclasses.replace(art, manifest=shifted), signals)


def threshold_variants(
    path: Path, depth: int, width: int, offsets: Sequence[float]
) -> dict[str, LearnedScheduler]:
    """The exported student at ``path`` (validated as load_scheduler does) at its threshold plus each
    offset, by :func:`variant_name`: the thresholds a pair check tries and a bundle may deploy."""
    return {variant_name(o): scheduler_at(path, depth, width, o) for o in offsets}


@dataclass(frozen=True)
class ModelSpec:
    target: Path
    mid: Path | None
    dtype: str
    device: str
    linear: str
    template: str


@dataclass(frozen=True)
class Deployment:
    """A loaded bundle: ``policy`` (a LearnedScheduler or a fixed policy's name), ``config`` (the
    pair's tree and decoding settings), ``costs`` (for :meth:`runtime`), ``decision`` (the pair
    check's: deploys, threshold_offset, threshold, prompts, speedup), ``models``, the folder and the
    sha256 of its checksums.json (the digest to pin), deployment.json as read, and the pair's
    latency profile (``profile``: what decoder.deploy.switch_off.for_deployment prices rounds with)."""

    pair_id: str
    policy: str | LearnedScheduler
    config: DecodeConfig
    costs: RuntimeCosts
    decision: dict[str, Any]
    models: ModelSpec
    folder: Path
    checksums_sha256: str
    record: dict[str, Any]
    profile: LatencyProfile

    @property
    def is_learned(self) -> bool:
        return isinstance(self.policy, LearnedScheduler)

    def runtime(self, prompt_tokens: int) -> RuntimeContext:
        """The runtime context for a prompt of ``prompt_tokens`` tokens."""
        return self.costs.context(prompt_tokens)


class _Bad(ValueError):
    """A field's value is wrong; the reader adds the file and the field."""


def _number(v: Any, low: float | None = None, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Bad(f"must be a finite number, got {v!r}")
    if low is not None and (v <= low if strict else v < low):
        raise _Bad(f"must be {'>' if strict else '>='} {low}, got {v!r}")
    return float(v)


def _int(v: Any, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _Bad(f"must be an integer >= {low}, got {v!r}")
    return v


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _Bad(f"must be a non-empty string, got {v!r}")
    return v


def _fields(v: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(f"must be a mapping, got {type(v).__name__}")
    missing, unknown = sorted(set(names) - set(v)), sorted(set(v) - set(names))
    if missing or unknown:
        raise _Bad(f"missing field(s) {missing}, unknown field(s) {unknown}")
    return v


def _decision(v: Any) -> dict[str, Any]:
    d = _fields(v, ("deploys", "threshold_offset", "threshold", "prompts", "speedup"))
    _int(d["prompts"], 0)
    if not isinstance(d["speedup"], dict) or not all(isinstance(k, str) for k in d["speedup"]):
        raise _Bad(f"speedup must map method names to numbers, got {d['speedup']!r}")
    for value in d["speedup"].values():
        _number(value, 0.0, strict=True)
    if d["deploys"] in FALLBACKS:
        if d["threshold_offset"] is not None or d["threshold"] is not None:
            raise _Bad(f"a fallback ({d['deploys']}) has threshold_offset and threshold null")
        return d
    offset, _ = _number(d["threshold_offset"]), _number(d["threshold"])
    if d["deploys"] != variant_name(offset):
        raise _Bad(f"deploys {d['deploys']!r} must be one of {FALLBACKS} or {variant_name(offset)!r}")
    return d


def _tree(v: Any) -> TreeConfig:
    d = _fields(v, tuple(f.name for f in dataclasses.fields(TreeConfig)))
    try:
        return TreeConfig(**{**d, "verify_ms": tuple(d["verify_ms"])})
    except (TypeError, ValueError) as err:
        raise _Bad(str(err)) from err


def _decode(v: Any) -> dict[str, Any]:
    d = _fields(v, ("max_new_tokens", "temperature", "seed"))
    _int(d["max_new_tokens"], 1), _number(d["temperature"], 0.0), _int(d["seed"], 0)
    return d


def _costs(v: Any) -> RuntimeCosts:
    d = _fields(v, ("target_ms", "mid_ms"))
    return RuntimeCosts(_number(d["target_ms"], 0.0, strict=True), _number(d["mid_ms"], 0.0))


def _models(v: Any) -> dict[str, Any]:
    d = _fields(v, ("target", "mid", "dtype", "device", "linear", "template"))
    for name in ("target", "dtype", "device", "linear", "template"):
        _text(d[name])
    if d["mid"] is not None:
        _text(d["mid"])
    return d


def _profile(v: Any) -> dict[str, Any]:
    d = _fields(v, ("pair", "device", "sha256"))
    _text(d["pair"]), _text(d["device"])
    if not is_hex_digest(d["sha256"]):
        raise _Bad(f"sha256 must be 64 hex digits, got {d['sha256']!r}")
    return d


def _provenance(v: Any) -> dict[str, Any]:
    d = _fields(v, ("git_revision", "inputs"))
    _text(d["git_revision"])
    if not isinstance(d["inputs"], dict) or not all(is_hex_digest(h) for h in d["inputs"].values()):
        raise _Bad(f"inputs must map input names to 64 hex digits, got {d['inputs']!r}")
    return d


def _schema(v: Any) -> str:
    if v != SCHEMA_VERSION:
        raise _Bad(f"must be {SCHEMA_VERSION!r}, got {v!r}")
    return v


def _pair_id(v: Any) -> str:
    if not is_pair_name(v):
        raise _Bad(f"must be a pair id usable as a folder name, got {v!r}")
    return v


def _manifest_digest(v: Any) -> str:
    if not is_hex_digest(v):
        raise _Bad(f"must be 64 hex digits, got {v!r}")
    return v


# deployment.json's fields, each with the check that parses it (the reader names the field)
FIELDS: dict[str, Callable[[Any], Any]] = {
    "schema_version": _schema,
    "pair_id": _pair_id,
    "decision": _decision,
    "tree": _tree,
    "decode": _decode,
    "runtime": _costs,
    "models": _models,
    "profile": _profile,
    "provenance": _provenance,
    "student_manifest_sha256": _manifest_digest,
}


def parse_record(record: Any, where: Path) -> dict[str, Any]:
    """Every field of deployment.json parsed by :data:`FIELDS`, or a DeploymentError naming it."""
    if not isinstance(record, dict):
        raise DeploymentError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing, unknown = [f for f in FIELDS if f not in record], sorted(set(record) - set(FIELDS))
    if missing:
        raise DeploymentError(f"{where}: missing field {missing[0]!r}")
    if unknown:
        raise DeploymentError(f"{where}: unknown field {unknown[0]!r}")
    out = {}
    for name, parse in FIELDS.items():
        try:
            out[name] = parse(record[name])
        except _Bad as err:
            raise DeploymentError(f"{where}: field {name!r} {err}") from err
    return out


def tree_record(tree: TreeConfig) -> dict[str, Any]:
    """A TreeConfig as deployment.json stores it (plain JSON values)."""
    d = dataclasses.asdict(tree)
    return {**d, "grafting": str(tree.grafting), "verify_ms": list(tree.verify_ms)}


def _policy(found: PairFolder, parsed: Mapping[str, Any]) -> str | LearnedScheduler:
    """The deployed policy, its student read from the bytes verified_folder hashed."""
    tree, decision, folder = parsed["tree"], parsed["decision"], found.folder
    path = folder / STUDENT_FILES[0]
    try:
        art = artifact_from_bytes(*(found.files[name] for name in STUDENT_FILES), "student", path)
        if art.manifest["manifest_sha256"] != parsed["student_manifest_sha256"]:
            raise DeploymentError(
                f"{path}: manifest_sha256 differs from {DEPLOYMENT_FILE}'s student_manifest_sha256"
            )
        if decision["deploys"] in FALLBACKS:
            scheduler_from(art, path, tree.depth, tree.width)  # the student is checked even when unused
            return decision["deploys"]
        policy = _shifted(art, path, tree.depth, tree.width, float(decision["threshold_offset"]))
    except ManifestError as err:
        raise DeploymentError(f"{path}: {err}") from err
    if not math.isclose(policy.threshold, float(decision["threshold"]), rel_tol=0, abs_tol=1e-12):
        raise DeploymentError(
            f"{folder / DEPLOYMENT_FILE}: decision.threshold {decision['threshold']} is not the student's "
            f"threshold plus the offset ({policy.threshold})"
        )
    return policy


def _model_path(folder: Path, text: str) -> Path:
    p = Path(text)
    return p if p.is_absolute() else (folder / p).resolve()


def load_deployment(
    path: Path | str, pair: str | None = None, expect_sha256: str | None = None
) -> Deployment:
    """Load and check a deployment bundle (module docstring): ``path`` is a bundle root (with
    index.json; ``pair`` names one, optional when it holds one) or a pair's folder; ``expect_sha256``
    pins the sha256 of the pair's checksums.json."""
    found = verified_folder(path, pair, REQUIRED_FILES, expect_sha256)
    where = found.folder / DEPLOYMENT_FILE
    as_written = parse_json(found.files[DEPLOYMENT_FILE], where)  # the bytes hashed, parsed
    parsed = parse_record(copy.deepcopy(as_written), where)
    if found.pair_id is not None and parsed["pair_id"] != found.pair_id:
        raise DeploymentError(
            f"{where}: pair_id {parsed['pair_id']!r}, but the index lists it as {found.pair_id!r}"
        )
    if pair is not None and parsed["pair_id"] != pair:
        raise DeploymentError(f"{where}: holds pair {parsed['pair_id']!r}, not {pair!r}")
    d, m = parsed["decode"], parsed["models"]
    config = DecodeConfig(d["max_new_tokens"], float(d["temperature"]), d["seed"], parsed["tree"])
    models = ModelSpec(
        _model_path(found.folder, m["target"]),
        None if m["mid"] is None else _model_path(found.folder, m["mid"]),
        m["dtype"], m["device"], m["linear"], m["template"],
    )  # fmt: skip
    policy = _policy(found, parsed)
    profile_path = found.folder / PROFILE_FILE
    raw = found.files[PROFILE_FILE]
    if hashlib.sha256(raw).hexdigest() != parsed["profile"]["sha256"]:
        raise DeploymentError(f"{profile_path}: not the latency profile deployment.json records "
                              f"(sha256 {parsed['profile']['sha256']})")  # fmt: skip
    try:
        profile = profile_from_bytes(raw, profile_path)
    except (ValueError, KeyError, TypeError) as e:
        raise DeploymentError(f"{profile_path}: not a latency profile ({e})") from e
    if models.mid is None and uses_mid(parse_policy(policy, config.tree.depth)):
        raise DeploymentError(f"{where}: deploys {parsed['decision']['deploys']}, which calls a mid drafter, "
                              "but models.mid is null")  # fmt: skip
    return Deployment(
        pair_id=parsed["pair_id"],
        policy=policy,
        config=config,
        costs=parsed["runtime"],
        decision=dict(parsed["decision"]),
        models=models,
        folder=found.folder,
        checksums_sha256=str(found.checksums_sha256),
        record=as_written,  # as written, for provenance
        profile=profile,
    )
