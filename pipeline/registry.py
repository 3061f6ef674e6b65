"""The MLflow model registry: each deployment bundle is a model version, the evaluated one `champion`.

Contract: :func:`register_bundles` (the ``deploy`` stage, inside its MLflow run) logs each pair's
bundle folder as artifacts of that run and registers it as a new version of the registered model
``treegraft-<pair>``, tagged with the sha256 of the bundle's checksums.json (the digest a user pins
with ``--expect-sha256``) and the git revision. :func:`promote_champions` (the ``wall_check``
stage, once ``evaluate`` priced the bundle and its policy decoded losslessly) moves the alias
``champion`` of each pair's model to the version whose digest is the bundle those stages loaded. A
bundle registered by no run (a deploy stage run before the registry existed, another store) is
reported, not promoted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from pipeline.tracking import git_revision

log = logging.getLogger(__name__)

CHAMPION = "champion"
DIGEST_TAG = "checksums_sha256"


def model_name(pair_id: str) -> str:
    return f"treegraft-{pair_id}"


def register_bundles(root: Path, digests: Mapping[str, str]) -> dict[str, str]:
    """Log and register every pair's bundle under ``root`` in the active run; {pair: version}."""
    import mlflow
    from mlflow.exceptions import MlflowException

    run = mlflow.active_run()
    if run is None:  # called outside a stage run (a unit test of the stage): nothing to register under
        log.warning("no active MLflow run: bundles under %s not registered", root)
        return {}
    client, run_id = mlflow.MlflowClient(), run.info.run_id
    versions = {}
    for pair_id, digest in digests.items():
        mlflow.log_artifacts(str(root / pair_id), artifact_path=f"deploy/{pair_id}")
        name = model_name(pair_id)
        try:
            client.create_registered_model(name, description=f"TreeGraft deployment bundle of {pair_id}")
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        version = client.create_model_version(
            name,
            source=mlflow.get_artifact_uri(f"deploy/{pair_id}"),
            run_id=run_id,
            tags={DIGEST_TAG: digest, "git.revision": git_revision()},
        )
        versions[pair_id] = str(version.version)
    return versions


def promote_champions(digests: Mapping[str, str]) -> dict[str, str | None]:
    """Point each pair's ``champion`` alias at its newest version with that digest; {pair: version}."""
    import mlflow

    client = mlflow.MlflowClient()
    out: dict[str, str | None] = {}
    for pair_id, digest in digests.items():
        name = model_name(pair_id)
        found = client.search_model_versions(f"name = '{name}' and tags.{DIGEST_TAG} = '{digest}'")
        if not found:
            log.warning("%s: no registered version holds bundle %s; champion not moved", name, digest)
            out[pair_id] = None
            continue
        version = str(max(int(v.version) for v in found))
        client.set_registered_model_alias(name, CHAMPION, version)
        out[pair_id] = version
    return out
