"""Overlays under DVC: dvc.yaml interpolates out_dirs from params.yaml alone, so a stage run by DVC
(``DVC_STAGE`` set) takes those values from params.yaml and everything else from the overlay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config.params import ROOT, ParamsError, load_params
from pipeline.cli import dvc_view, interpolated_keys


def test_dvc_yaml_interpolates_out_dirs_only_and_the_view_pins_each_of_them() -> None:
    keys = interpolated_keys()
    assert "data.out_dir" in keys and "zoo.out_dir" in keys and "overlay" not in keys
    assert all(k.endswith(("out_dir", "_dir")) for k in keys), keys
    params = load_params(profile="smoke", overrides=dvc_view(None))
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    assert params.data.out_dir == raw["data"]["out_dir"] != load_params(profile="smoke").data.out_dir
    assert params.zoo.models == load_params(profile="smoke").zoo.models  # the overlay's sizes stay


def test_a_params_file_without_an_interpolated_key_is_named(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    del raw["zoo"]["out_dir"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ParamsError, match=r"zoo\.out_dir"):
        dvc_view(path)


@pytest.mark.parametrize("under_dvc", [True, False])
def test_a_stage_command_under_dvc_reads_out_dirs_from_params_yaml(tmp_path: Path, under_dvc: bool) -> None:
    """The smoke overlay set in params.yaml, as `dvc exp run -S overlay=smoke` leaves it: under DVC
    the stage sees params.yaml's out_dir; run by hand it sees the overlay's."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["overlay"] = "smoke"
    (tmp_path / "profiles").mkdir()
    for f in (ROOT / "profiles").glob("*.yaml"):
        (tmp_path / "profiles" / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    probe = (
        "import sys; from pipeline import cli;"
        "cli.run_stage('zoo', lambda p: print('OUT', p.zoo.out_dir, p.zoo.train.seq_len))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    if under_dvc:
        env["DVC_STAGE"] = "zoo"
    done = subprocess.run(
        [sys.executable, "-c", probe, "--params", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out_dir, seq_len = done.stdout.split("OUT ")[1].split()
    smoke = load_params(path)
    assert int(seq_len) == smoke.zoo.train.seq_len  # the overlay's sizes either way
    assert out_dir == (raw["zoo"]["out_dir"] if under_dvc else smoke.zoo.out_dir)
