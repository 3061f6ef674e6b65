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
deployment.json (decoder/deploy/record.py: missing, unknown or ill-typed fields are one
:class:`DeploymentError` naming the file and each field), then the student like
decoder.deploy.scheduler.load_scheduler (manifest, checksums, feature order, D and W against the
bundle's tree) and that the decision's threshold is the manifest's plus the offset. It returns a
:class:`Deployment`: ``generate(pair, ids, d.policy, d.config, d.runtime(len(ids)))`` decodes as
the pipeline's deployed row does; ``decoder.deploy.switch_off.for_deployment(d)`` in place of
``d.policy`` adds the per-request switch-off, priced with the bundle's profile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoder.core.adaptive import AdaptiveThresholds
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.policies import RuntimeContext, parse_policy, uses_mid
from decoder.deploy.artifact import Artifact, ManifestError, artifact_from_bytes, read_artifact
from decoder.deploy.bundle import DeploymentError, PairFolder, parse_json, verified_folder
from decoder.deploy.latency import LatencyProfile, profile_from_bytes
from decoder.deploy.record import DeploymentRecord, parse_record, variant_name
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

DEPLOYMENT_FILE = "deployment.json"
STUDENT_FILES = ("scheduler.json", "scheduler.safetensors")
PROFILE_FILE = "profile.json"  # the pair's latency profile: the costs and the switch-off's prices
REQUIRED_FILES = (DEPLOYMENT_FILE, *STUDENT_FILES, PROFILE_FILE)


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

    @property
    def adaptive(self) -> AdaptiveThresholds:
        """The online adaptive rule's thresholds the pair check chose for this pair."""
        chosen = self.decision["adaptive"]
        return AdaptiveThresholds(float(chosen["margin"]), int(chosen["probe"]))

    def runtime(self, prompt_tokens: int) -> RuntimeContext:
        """The runtime context for a prompt of ``prompt_tokens`` tokens."""
        return self.costs.context(prompt_tokens)


def tree_record(tree: TreeConfig) -> dict[str, Any]:
    """A TreeConfig as deployment.json stores it (plain JSON values)."""
    d = dataclasses.asdict(tree)
    return {**d, "grafting": str(tree.grafting), "verify_ms": list(tree.verify_ms)}


def _policy(found: PairFolder, rec: DeploymentRecord, tree: TreeConfig) -> str | LearnedScheduler:
    """The deployed policy, its student read from the bytes verified_folder hashed."""
    decision, folder = rec.decision, found.folder
    path = folder / STUDENT_FILES[0]
    try:
        art = artifact_from_bytes(*(found.files[name] for name in STUDENT_FILES), "student", path)
        if art.manifest["manifest_sha256"] != rec.student_manifest_sha256:
            raise DeploymentError(
                f"{path}: manifest_sha256 differs from {DEPLOYMENT_FILE}'s student_manifest_sha256"
            )
        if decision.threshold_offset is None or decision.threshold is None:  # a fallback (record.py)
            scheduler_from(art, path, tree.depth, tree.width)  # the student is checked even when unused
            return decision.deploys
        policy = _shifted(art, path, tree.depth, tree.width, decision.threshold_offset)
    except ManifestError as err:
        raise DeploymentError(f"{path}: {err}") from err
    if not math.isclose(policy.threshold, decision.threshold, rel_tol=0, abs_tol=1e-12):
        raise DeploymentError(
            f"{folder / DEPLOYMENT_FILE}: decision.threshold {decision.threshold} is not the student's "
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
    rec = parse_record(found.files[DEPLOYMENT_FILE], where)
    if found.pair_id is not None and rec.pair_id != found.pair_id:
        raise DeploymentError(
            f"{where}: pair_id {rec.pair_id!r}, but the index lists it as {found.pair_id!r}"
        )
    if pair is not None and rec.pair_id != pair:
        raise DeploymentError(f"{where}: holds pair {rec.pair_id!r}, not {pair!r}")
    d, m = rec.decode, rec.models
    config = DecodeConfig(d.max_new_tokens, d.temperature, d.seed, rec.tree.config())
    models = ModelSpec(
        _model_path(found.folder, m.target),
        None if m.mid is None else _model_path(found.folder, m.mid),
        m.dtype, m.device, m.linear, m.template,
    )  # fmt: skip
    policy = _policy(found, rec, config.tree)
    profile_path = found.folder / PROFILE_FILE
    raw = found.files[PROFILE_FILE]
    if hashlib.sha256(raw).hexdigest() != rec.profile.sha256:
        raise DeploymentError(f"{profile_path}: not the latency profile deployment.json records "
                              f"(sha256 {rec.profile.sha256})")  # fmt: skip
    try:
        profile = profile_from_bytes(raw, profile_path)
    except (ValueError, KeyError, TypeError) as e:
        raise DeploymentError(f"{profile_path}: not a latency profile ({e})") from e
    if models.mid is None and uses_mid(parse_policy(policy, config.tree.depth)):
        raise DeploymentError(f"{where}: deploys {rec.decision.deploys}, which calls a mid drafter, "
                              "but models.mid is null")  # fmt: skip
    return Deployment(
        pair_id=rec.pair_id,
        policy=policy,
        config=config,
        costs=RuntimeCosts(rec.runtime.target_ms, rec.runtime.mid_ms),
        decision=dict(as_written["decision"]),
        models=models,
        folder=found.folder,
        checksums_sha256=str(found.checksums_sha256),
        record=as_written,  # as written, for provenance
        profile=profile,
    )
