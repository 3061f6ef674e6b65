"""The smoke overlay through DVC itself, as a user switches overlays: `dvc exp run -S overlay=smoke`
on a git copy of the project runs every stage at the overlay's sizes, writes where dvc.yaml says
(params.yaml's out_dirs), and leaves `dvc status` clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config.params import ROOT, load_params

COPIED = ("config", "decoder", "features", "collectors", "models", "pipeline", "profiles", "prompts")


def _run(args: list[str], root: Path, timeout: int) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_STAGE", "MLFLOW_TRACKING_URI")}
    env |= {"PYTHONPATH": str(root), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    env |= {"HF_HUB_OFFLINE": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout[-4000:]}{done.stderr[-6000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_the_smoke_overlay_runs_through_dvc_and_writes_where_dvc_yaml_says(tmp_path: Path) -> None:
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    if dvc is None or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed in this environment")
    for name in COPIED:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".gitignore").write_text("/artifacts/\nmlflow.db\nmlruns/\n__pycache__/\n")
    _run(["git", "init", "-q"], tmp_path, 60)
    _run([dvc, "init", "-q"], tmp_path, 60)
    _run(["git", "add", "-A"], tmp_path, 60)
    _run(["git", "commit", "-qm", "a user's clone"], tmp_path, 60)

    _run([dvc, "exp", "run", "-S", "overlay=smoke"], tmp_path, 1500)

    base, smoke = load_params(), load_params(profile="smoke")
    assert base.zoo.out_dir != smoke.zoo.out_dir  # run by hand, smoke writes elsewhere
    assert not (tmp_path / smoke.zoo.out_dir).exists()
    config = json.loads((tmp_path / base.zoo.out_dir / "target-l/config.json").read_text(encoding="utf-8"))
    # the overlay's sizes (3 layers), not params.yaml's (96)
    assert (
        config["num_hidden_layers"]
        == smoke.zoo.models["target-l"].layers
        != base.zoo.models["target-l"].layers
    )
    index = json.loads((tmp_path / base.deploy.out_dir / "index.json").read_text(encoding="utf-8"))
    assert set(index["pairs"]) == set(smoke.evaluate.pairs)
    assert (tmp_path / base.evaluate.out_dir / "metrics.json").is_file()
    wall = json.loads((tmp_path / base.wall_check.out_dir / "metrics.json").read_text(encoding="utf-8"))
    assert set(wall["agreement"]) == set(smoke.evaluate.pairs)  # every pair checked against the clock
    lock = yaml.safe_load((tmp_path / "dvc.lock").read_text(encoding="utf-8"))["stages"]
    assert set(lock) == set(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    assert all(
        s["params"]["params.yaml"]["overlay"] == "smoke" for n, s in lock.items() if n != "fingerprint"
    )
    status = _run([dvc, "status"], tmp_path, 300)
    assert "up to date" in status, status
