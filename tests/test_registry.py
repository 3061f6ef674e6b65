"""The model registry: each deploy run registers its bundles; wall_check moves `champion` to the one
it scored."""

from __future__ import annotations

from pathlib import Path

import mlflow

from config.params import load_params
from pipeline.registry import CHAMPION, DIGEST_TAG, model_name, promote_champions, register_bundles
from pipeline.tracking import open_store


def _bundle(root: Path, pair: str, text: str) -> None:
    (root / pair).mkdir(parents=True, exist_ok=True)
    (root / pair / "deployment.json").write_text(text, encoding="utf-8")


def test_registered_versions_and_the_champion_follow_the_scored_bundle(tmp_path: Path) -> None:
    params = load_params(profile="smoke", overrides={"mlflow": {"db": str(tmp_path / "mlflow.db")}})
    client, exp_id = open_store(params.mlflow)
    root = tmp_path / "deploy"
    versions = []
    for digest, text in (("a" * 64, '{"v": 1}'), ("b" * 64, '{"v": 2}')):
        _bundle(root, "zoo-m", text)
        with mlflow.start_run(experiment_id=exp_id):
            versions.append(register_bundles(root, {"zoo-m": digest})["zoo-m"])
    assert versions == ["1", "2"]
    name = model_name("zoo-m")
    first = client.get_model_version(name, "1")
    assert first.tags[DIGEST_TAG] == "a" * 64
    # the registered source holds the bundle as it was when that run registered it
    local = Path(mlflow.artifacts.download_artifacts(first.source, dst_path=str(tmp_path / "got")))
    assert (local / "deployment.json").read_text(encoding="utf-8") == '{"v": 1}'

    assert promote_champions({"zoo-m": "a" * 64}) == {"zoo-m": "1"}
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "1"
    assert promote_champions({"zoo-m": "b" * 64}) == {"zoo-m": "2"}
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "2"
    # a bundle no run registered moves nothing
    assert promote_champions({"zoo-m": "c" * 64}) == {"zoo-m": None}
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "2"
