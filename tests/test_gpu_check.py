"""The one-command device check (benchmarks/gpu_check.py) runs on a CPU at smoke sizes, as CI runs
`make gpu-check DEVICE=cpu`, so the script a GPU slot runs once cannot rot."""

from __future__ import annotations

import json
import time

import pytest
import torch
from markdown_rows import md_tables

from benchmarks.gpu_check import POLICIES, main
from collectors.pricing.profiling import profile_clock
from decoder.core.timing import EventClock, device_clock

PAIR = "zoo-m"  # the pair with a zoo block drafter: every policy row runs


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    out = tmp_path_factory.mktemp("gpu_check")
    rc = main(["--device", "cpu", "--smoke", "--train-zoo", "--pairs", PAIR, "--out", str(out)])
    return rc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_every_fp32_row_is_lossless_and_the_exit_status_says_so(checked: tuple[int, dict, str]) -> None:
    rc, report, _ = checked
    rows = report["pairs"][PAIR]["float32"]["rows"]
    assert rc == 0 and report["fp32_lossless"] is True
    assert all(r["lossless"] for r in rows.values() if r["available"])
    # the rows that need only the zoo always run; only the deployed row may lack its bundle
    assert all(rows[p]["available"] for p in POLICIES if p != "deployed")


def test_every_policy_has_a_row_in_both_dtypes_and_the_table(checked: tuple[int, dict, str]) -> None:
    _, report, table = checked
    for dtype in ("float32", "bfloat16"):
        assert list(report["pairs"][PAIR][dtype]["rows"]) == list(POLICIES)
    bf16 = report["pairs"][PAIR]["bfloat16"]["rows"]
    for row in bf16.values():
        if row["available"]:  # every divergence is classified, and the verdict follows from it
            assert row["lossless"] == (row["check"]["real_mismatches"] == 0)
            assert all(d["near_tie"] == (d["gap"] <= d["tolerance"]) for d in row["divergences"])
    [rows] = md_tables(table)
    assert [r[0] for r in rows[1:]] == list(POLICIES)
    assert report["device_name"] in table


def test_priced_over_measured_ratio_from_the_device_profile(checked: tuple[int, dict, str]) -> None:
    _, report, _ = checked
    rows = report["pairs"][PAIR]["float32"]["rows"]
    assert report["profile"]["pair"] == PAIR
    for policy in ("ar", "all-small", "all-mid", "10101"):
        ratio = rows[policy]["priced_over_measured"]
        assert ratio is not None and 0 < ratio < float("inf")
    assert rows["ar"]["speedup_vs_ar"] == pytest.approx(1.0)


def test_budget_choice_is_a_budget_within_the_tree(checked: tuple[int, dict, str]) -> None:
    _, report, _ = checked
    choice = report["budget_choice"]
    assert 1 <= choice["budget"] <= report["sizes"]["tree_budget"]
    assert choice["shape"] in choice["shapes"]


def test_device_clock_is_the_host_clock_off_cuda() -> None:
    clock, name = device_clock(torch.device("cpu"))
    assert clock is time.perf_counter and name == "wall"
    with pytest.raises(ValueError, match="CUDA device"):
        EventClock(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_event_clock_times_gpu_work_and_the_profile_uses_it() -> None:
    device = torch.device("cuda")
    clock, name = device_clock(device)
    x = torch.randn(2048, 2048, device=device)
    t0 = clock()
    for _ in range(20):
        x = x @ x / 2048
    t1 = clock()
    assert name == "cuda_events" and t1 > t0  # the readings wait for the queued matmuls
    assert profile_clock(device)[1] == "cuda_events"


def test_profile_clock_off_cuda_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert profile_clock(cpu) == (time.thread_time, "thread_cpu")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert profile_clock(cpu) == (time.perf_counter, "wall")
