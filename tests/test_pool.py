"""The process pool changes nothing but speed: collect's Parquet tables byte for byte, evaluate's
priced rows field by field, with 1 and 2 workers (`slow`: they start worker processes that load the
models); a failing task names itself; cells sharing a target compute its work once and equal cells
computed on their own."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from collect_workspace import build_workspace, merged_bytes, params_for, run_collect
from conftest import save_pair
from transformers import AutoTokenizer

from collectors.collect.plan import load_registered_pair, pass_profiles
from collectors.collect.pool import Task, TaskError, run_tasks
from collectors.collect.replay import Replayer
from collectors.evaluation import priced_eval
from collectors.evaluation.eval_report import priced_rows
from collectors.evaluation.fixed_cells import FIXED_METHODS
from collectors.evaluation.priced_eval import PricedCell, TargetMemo, priced_cell
from collectors.evaluation.priced_tasks import (
    cell_inputs,
    decode_config,
    fixed_for,
    longest_first,
    priced_cells,
    target_groups,
)
from config.params import ROOT, Params, load_params
from decoder.core.policies import FixedSchedule

CELLS = [("tiny", "code"), ("tiny", "chat"), ("tiny-w", "code"), ("tiny-w", "chat")]
POLICIES = {"odd-steps": FixedSchedule((True, False, True, False, True))}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return pool_workspace(tmp_path_factory.mktemp("pool"))


def pool_workspace(folder: Path) -> Path:
    """build_workspace's tiny pair, and a second pair on its target (tiny-w)."""
    root = build_workspace(folder)
    # a second pair on the same target with its own mid drafter (as zoo-lw beside zoo-l)
    save_pair(root / "pair-w", AutoTokenizer.from_pretrained(root / "pair/target"), seed=71)
    shutil.rmtree(root / "pair-w/target")
    shutil.copy(root / "profile/tiny.json", root / "profile/tiny-w.json")
    return root


def eval_params(root: Path, workers: int) -> Params:
    base = params_for(root)
    pairs = {
        name: {"target": str(root / "pair/target"), "mid": str(root / mid), "dtype": "float32",
               "device": "cpu", "template": "zoo", "linear": "stock"}
        for name, mid in (("tiny", "pair/mid"), ("tiny-w", "pair-w/mid"))
    }  # fmt: skip
    overrides = {
        "mlflow": {"db": base.mlflow.db},
        "data": {"out_dir": base.data.out_dir},
        "profile": {"out_dir": base.profile.out_dir},
        "budget": {"mode": "fixed", "out_dir": base.budget.out_dir},
        "pairs": pairs,
        "evaluate": {"pairs": ["tiny", "tiny-w"], "datasets": ["code", "chat"], "prompt_start": 0,
                     "prompts_per_cell": 2, "max_new_tokens": 12, "workers": workers},
    }  # fmt: skip
    return load_params(profile="smoke", overrides=overrides)


@pytest.mark.slow
def test_collect_tables_are_byte_identical_with_two_workers(workspace) -> None:
    one = params_for(workspace, name="one", workers=1)
    two = params_for(workspace, name="two", workers=2)
    assert run_collect(one) == run_collect(two)
    assert merged_bytes(one) == merged_bytes(two)
    for folder in sorted((Path(one.collect.out_dir) / "reports").iterdir()):
        other = Path(two.collect.out_dir) / "reports" / folder.name
        for f in sorted(folder.glob("*.parquet")):
            assert f.read_bytes() == (other / f.name).read_bytes(), f"{folder.name}/{f.name}"


def _same(a: PricedCell, b: PricedCell) -> None:
    """Field by field, the per-pass prices included (each method's and AR's under every pass)."""
    assert a.best_fixed == b.best_fixed
    np.testing.assert_array_equal(a.ar_ms, b.ar_ms)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (a.pass_ar_ms is None) == (b.pass_ar_ms is None)
    if a.pass_ar_ms is not None:
        np.testing.assert_array_equal(a.pass_ar_ms, b.pass_ar_ms)
    assert a.methods.keys() == b.methods.keys()
    for name, m in a.methods.items():
        n = b.methods[name]
        assert (m.name, m.schedule, m.accepted, m.mid_calls_per_step) == (
            n.name, n.schedule, n.accepted, n.mid_calls_per_step,
        ), name  # fmt: skip
        np.testing.assert_array_equal(m.ms, n.ms, err_msg=name)
        np.testing.assert_array_equal(m.tokens, n.tokens, err_msg=name)
        assert (m.pass_ms is None) == (n.pass_ms is None), name
        if m.pass_ms is not None:
            np.testing.assert_array_equal(m.pass_ms, n.pass_ms, err_msg=name)


@pytest.mark.slow
def test_priced_cells_equal_with_two_workers(workspace) -> None:
    """Two worker processes price every cell as one process does (which equals cell by cell: below)."""
    one, two = eval_params(workspace, 1), eval_params(workspace, 2)
    local = priced_cells(one, CELLS, POLICIES, FIXED_METHODS)
    pooled = priced_cells(two, CELLS, POLICIES, FIXED_METHODS)
    for cell in CELLS:
        _same(pooled[cell], local[cell])
        assert priced_rows(pooled[cell], 200) == priced_rows(local[cell], 200)


def test_priced_cells_sharing_a_target_equal_cell_by_cell(workspace, monkeypatch) -> None:
    one = eval_params(workspace, 1)
    assert target_groups(one, CELLS) == [
        [("tiny", "code"), ("tiny-w", "code")],
        [("tiny", "chat"), ("tiny-w", "chat")],
    ]
    calls: list[tuple] = []
    real = Replayer.continuation

    def count(self, prompt):
        calls.append(tuple(prompt))
        return real(self, prompt)

    monkeypatch.setattr(Replayer, "continuation", count)
    progress: list[int] = []
    local = priced_cells(one, CELLS, POLICIES, FIXED_METHODS, progress.append)
    assert progress == [4, 4]  # one group of two 2-prompt cells per dataset
    assert len(calls) == len(set(calls)) == 4  # g once per (target, prompt): the w pair reuses it

    # the old path: each cell alone with a plain Replayer, nothing shared or reused
    def plain(pair, config, schedules, memo, profile, batch_rows):
        return Replayer(pair, config, schedules, 0, batch_rows=batch_rows)

    monkeypatch.setattr(priced_eval, "MemoReplayer", plain)
    for cell in CELLS:
        pair = load_registered_pair(one, cell[0])
        _, prompts, profile, runtime = cell_inputs(one, *cell, pair, 2)
        config = decode_config(one, cell[0])
        rows, passes = one.runtime.replay_batch_rows, pass_profiles(one, cell[0])
        alone = priced_cell(
            pair,
            prompts,
            config,
            profile,
            runtime,
            POLICIES,
            fixed_for(one, cell[0], FIXED_METHODS),
            batch_rows=rows,
            passes=passes,
        )
        _same(local[cell], alone)
        assert priced_rows(local[cell], 200) == priced_rows(alone, 200)
    assert priced_rows(local[("tiny", "code")], 200) != priced_rows(local[("tiny-w", "code")], 200)


def test_the_costliest_groups_are_handed_out_first(tmp_path) -> None:
    pairs = {}
    for name, n_bytes in (("small", 10), ("mid", 1000), ("big", 3000)):
        for part, size in (("target", n_bytes), ("mid", 1)):
            (tmp_path / name / part).mkdir(parents=True)
            (tmp_path / name / part / "model.safetensors").write_bytes(b"x" * size)
        pairs[name] = {"target": str(tmp_path / name / "target"), "mid": str(tmp_path / name / "mid"),
                       "dtype": "float32", "device": "cpu", "template": "zoo", "linear": "stock"}  # fmt: skip
    params = load_params(profile="smoke", overrides={"pairs": pairs})
    groups = [
        [("small", "a")],
        [("mid", "a")],
        [("big", "a")],
        [("small", "b"), ("small", "c")],
        [("mid", "b")],
    ]
    # bytes 11, 1001, 3001, 22, 1001: the largest first, plan order between the two equal ones
    assert longest_first(params, groups) == [2, 1, 4, 3, 0]


def test_a_memo_refuses_another_target(workspace) -> None:
    params = eval_params(workspace, 1)
    memo = TargetMemo()
    memo.check(load_registered_pair(params, "tiny"))
    other = load_registered_pair(params, "tiny-w")  # same target checkpoint: accepted
    memo.check(other)
    memo.owner = ("elsewhere", *memo.owner[1:])
    with pytest.raises(ValueError, match="TargetMemo"):
        priced_eval.MemoReplayer(other, decode_config(params, "tiny-w"), [], memo)


def test_a_failing_task_names_itself_and_results_keep_task_order() -> None:
    tasks = [Task(f"cell-{x}", (float(x),)) for x in (9, 4, 16, 1)]
    assert run_tasks(math.sqrt, tasks, 2, 1) == [3.0, 2.0, 4.0, 1.0] == run_tasks(math.sqrt, tasks, 1, 1)
    bad = [*tasks, Task("zoo-l/alpaca", (-1.0,))]
    with pytest.raises(TaskError, match=r"zoo-l/alpaca: ValueError: math domain error"):
        run_tasks(math.sqrt, bad, 2, 1)


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_exit_when_the_parent_is_killed() -> None:
    code = "import time\nfrom collectors.collect.pool import Task, run_tasks\n"
    code += "run_tasks(time.sleep, [Task(str(i), (60,)) for i in range(4)], 2, 1)\n"
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(parent.pid) - _trackers(parent.pid)) < 2:
            assert time.monotonic() < deadline, "the pool never started its workers"
            time.sleep(0.2)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, "workers outlived their killed parent"
        time.sleep(0.2)


def _trackers(pid: int) -> set[int]:
    return {c for c in _children(pid) if b"resource_tracker" in Path(f"/proc/{c}/cmdline").read_bytes()}


def test_a_worker_that_dies_fails_the_run_instead_of_hanging() -> None:
    with pytest.raises(TaskError, match="worker process died"):
        run_tasks(os._exit, [Task("a", (3,)), Task("b", (3,))], 2, 1)
