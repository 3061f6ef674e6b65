"""glibc keeps freed memory where runtime.keep_freed_memory says so (decoder/models/memory.py): a churn of
allocations that faults its pages in again every round under the defaults faults none, in a stage's
process (pipeline.runtime.apply_runtime) and in its worker processes (collectors.collect.pool.run_tasks)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from page_faults import faults_of_churn

from collectors.collect.pool import Task, run_tasks
from config.params import ROOT
from decoder.models.memory import MMAP_THRESHOLD_MAX, keep_freed_memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
PAGES_A_ROUND = 6 * (2 << 20) // 4096  # the churn's blocks, in 4 KiB pages


def faults_in_a_stage_process(keep: bool) -> int:
    """The churn's faults in a fresh process after apply_runtime with the params' runtime section."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from config.params import load_params\n"
        "from pipeline.runtime import apply_runtime\n"
        "from page_faults import faults_of_churn\n"
        f"apply_runtime(load_params(overrides={{'runtime': {{'keep_freed_memory': {keep}}}}}))\n"
        "print(faults_of_churn())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_stage_process_keeps_freed_memory_only_when_asked() -> None:
    default, kept = faults_in_a_stage_process(False), faults_in_a_stage_process(True)
    assert default > 20 * PAGES_A_ROUND / 2  # the defaults fault in most of every round's pages
    assert kept < default / 100


@glibc
def test_worker_processes_keep_freed_memory_only_when_asked() -> None:
    tasks = [Task("a", (20,)), Task("b", (20,))]
    kept = run_tasks(faults_of_churn, tasks, 2, 1, keep_freed=True)
    default = run_tasks(faults_of_churn, tasks, 2, 1, keep_freed=False)
    assert all(d > 20 * PAGES_A_ROUND / 2 for d in default), default
    assert all(k < min(default) / 100 for k in kept), (kept, default)


@glibc
def test_this_process_after_keep_freed_memory() -> None:
    assert keep_freed_memory() is True
    assert faults_of_churn() < PAGES_A_ROUND


@pytest.mark.parametrize("bad", [{"trim_bytes": -1}, {"mmap_bytes": MMAP_THRESHOLD_MAX + 1}])
def test_thresholds_glibc_would_refuse_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="keep_freed_memory"):
        keep_freed_memory(**bad)
