"""`python -m pipeline.<stage> --params FILE` as a command: the learning stages on synthetic tables.

Each stage runs in its own process, as DVC runs it, against a params file written into a temporary
folder (params.yaml + the smoke overlay + temporary out_dirs, overlay ``base``) beside a copy of
profiles/. A bad params file and a read of an undeclared param fail the command, naming the key.

Every test starts Python processes that import the stages, so the module is `slow` (`make test-all`);
tests/test_params.py checks the same validation in process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc_outputs import declared_paths
from synthetic_collect import write_synthetic_collect

from config.params import ROOT, deep_merge, load_params, load_raw
from features.schemas import samples_spec, states_spec
from features.tables import read_table
from pipeline import canonicalize
from pipeline.cli import stage_params

pytestmark = pytest.mark.slow

STAGES = ("canonicalize", "select_signals", "fit_value", "margins", "distill", "export")
ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}


def write_params(folder: Path, overrides: dict) -> Path:
    """folder/params.yaml: the smoke profile plus overrides, complete, with the empty overlay."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "profiles", folder / "profiles", dirs_exist_ok=True)
    raw = deep_merge(load_raw(profile="smoke"), overrides) | {"overlay": "base"}
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def command(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def out_dirs(root: Path) -> dict:
    overrides = {"collect": {"out_dir": str(root / "collect")}, "mlflow": {"db": str(root / "mlflow.db")}}
    return overrides | {s: {"out_dir": str(root / s)} for s in STAGES}


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    root = tmp_path_factory.mktemp("commands")
    write_synthetic_collect(root / "collect", n_reports=6, depth=5, seed=2)
    path = write_params(root, out_dirs(root))
    done = {}
    for stage in STAGES:
        done[stage] = command(["-m", f"pipeline.{stage}", "--params", str(path)])
        if done[stage].returncode != 0:
            break
    return path, done


def test_every_stage_runs_as_a_command_and_writes_what_dvc_declares(commands) -> None:
    path, done = commands
    for stage in STAGES:
        assert stage in done, "not run: an earlier stage failed"
        assert done[stage].returncode == 0, f"{stage} failed:\n{done[stage].stderr[-3000:]}"
    params = load_params(path)
    for stage, paths in declared_paths(params, STAGES).items():
        for out in paths:
            assert out.exists(), f"{stage}: {out} declared in dvc.yaml was not written by the command"
            assert str(out).startswith(str(path.parent)), f"{stage} wrote outside the params' folders: {out}"
    assert json.loads((Path(params.canonicalize.out_dir) / "metrics.json").read_text())["n_states"] == 6 * 31


def test_the_command_computes_what_main_computes(commands, tmp_path: Path) -> None:
    """canonicalize in-process on the same input equals the command's tables, row for row."""
    path, done = commands
    assert done["canonicalize"].returncode == 0, done["canonicalize"].stderr[-3000:]
    cmd_params = load_params(path)
    here = load_params(
        path, overrides={"canonicalize": {"out_dir": str(tmp_path)}, "mlflow": {"db": str(tmp_path / "m.db")}}
    )
    canonicalize.main(stage_params("canonicalize", here))
    depth = here.tree.depth
    for name, spec in (("states.parquet", states_spec(depth)), ("samples.parquet", samples_spec(depth))):
        ours = read_table(tmp_path / name, spec)
        theirs = read_table(Path(cmd_params.canonicalize.out_dir) / name, spec)
        assert ours.equals(theirs), name


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"canonicalize": {"n_fold": 5}},
            "params.canonicalize.n_fold: Extra inputs are not permitted, got 5",
        ),
        (
            {"canonicalize": {"n_folds": "five"}},
            "params.canonicalize.n_folds: Input should be a valid integer, got 'five'",
        ),
    ],
)
def test_a_bad_params_file_fails_naming_the_key(tmp_path: Path, edit: dict, message: str) -> None:
    write_synthetic_collect(tmp_path / "collect", n_reports=1, depth=5, seed=0)
    path = write_params(tmp_path, deep_merge(out_dirs(tmp_path), edit))
    res = command(["-m", "pipeline.canonicalize", "--params", str(path)], timeout=300)
    assert res.returncode != 0
    assert message in res.stderr
    assert not (tmp_path / "canonicalize").exists()  # failed before writing anything


def test_a_params_file_missing_a_key_fails_naming_it(tmp_path: Path) -> None:
    path = write_params(tmp_path, out_dirs(tmp_path))
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    del raw["canonicalize"]["n_folds"]
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    res = command(["-m", "pipeline.canonicalize", "--params", str(path)], timeout=300)
    assert res.returncode != 0
    assert "params.canonicalize.n_folds: Field required" in res.stderr


@pytest.mark.parametrize(
    ("read", "key"),
    [
        ("params.fit_value.hidden", "params.fit_value.hidden"),  # a section canonicalize does not list
        ("params.tree.width", "params.tree.width"),  # canonicalize lists tree.depth only
    ],
)
def test_a_stage_reading_an_undeclared_param_fails(tmp_path: Path, read: str, key: str) -> None:
    """run_stage hands main only what dvc.yaml lists for the stage; declared keys still read."""
    path = write_params(tmp_path, out_dirs(tmp_path))
    script = (
        "import sys\n"
        "from pipeline.cli import run_stage\n"
        "def main(params):\n"
        "    print('depth', params.tree.depth, 'folds', params.canonicalize.n_folds, flush=True)\n"
        f"    return {read}\n"
        "run_stage('canonicalize', main)\n"
    )
    res = command(["-c", script, "--params", str(path)], timeout=300)
    assert res.returncode != 0
    assert "depth 5 folds 5" in res.stdout
    assert f"stage 'canonicalize' reads {key}" in res.stderr
