"""A stage run by hand holds a lock: a second run of the same stage into the same folder stops at
once with exit 2 and one line naming the first run's pid; a killed run leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cli import StageBusyError, lock_path, stage_lock
from tests.test_stage_commands import out_dirs, write_params

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"} | {"MLFLOW_DISABLE_TELEMETRY": "true"}


def start_stage(params: Path, ready: Path, seconds: float) -> subprocess.Popen:
    """``run_stage('canonicalize', main)`` whose main touches ``ready`` and sleeps."""
    script = (
        "import time\n"
        "from pathlib import Path\n"
        "from pipeline.cli import run_stage\n"
        "def main(params):\n"
        f"    Path({str(ready)!r}).touch()\n"
        f"    time.sleep({seconds})\n"
        "    print('finished', flush=True)\n"
        "run_stage('canonicalize', main)\n"
    )
    args = [sys.executable, "-c", script, "--params", str(params)]
    return subprocess.Popen(
        args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    for _ in range(1200):
        if path.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert path.exists(), proc.communicate()[1]


def test_a_second_run_of_a_running_stage_is_refused(tmp_path: Path) -> None:
    params = write_params(tmp_path, out_dirs(tmp_path))
    first = start_stage(params, tmp_path / "ready1", 60)
    try:
        wait_for(tmp_path / "ready1", first)
        second = start_stage(params, tmp_path / "ready2", 0)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2
        assert err.strip().splitlines() == [
            f"error: stage canonicalize is already running (pid {first.pid}); "
            f"lock {tmp_path / '.locks' / 'canonicalize.lock'}"
        ]
        assert not (tmp_path / "ready2").exists() and "finished" not in out  # main never ran
        first.send_signal(signal.SIGKILL)  # the OS drops the flock of a dead process
        first.wait(timeout=30)
        third = start_stage(params, tmp_path / "ready3", 0)
        out, err = third.communicate(timeout=120)
        assert third.returncode == 0, err
        assert "finished" in out
    finally:
        first.kill()


def test_stage_lock_is_released_after_the_run(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "zoo.lock"
    busy = pytest.raises(StageBusyError, match=rf"stage zoo is already running \(pid {os.getpid()}\)")
    with stage_lock("zoo", path), busy, stage_lock("zoo", path):  # a second open conflicts, even here
        pass
    with stage_lock("zoo", path):  # released: taken again
        pass


def test_lock_sits_beside_the_out_dir(tmp_path: Path) -> None:
    from config.params import load_params

    params = load_params(write_params(tmp_path, out_dirs(tmp_path)))
    assert lock_path("canonicalize", params) == tmp_path / ".locks" / "canonicalize.lock"
    assert lock_path("fingerprint", params) == ROOT / "artifacts" / ".locks" / "fingerprint.lock"
