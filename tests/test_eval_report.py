"""Evaluation tables from result rows: cell order, groups, ablation order, plot rows, priced rows."""

from __future__ import annotations

import numpy as np
import pytest

from collectors.evaluation.eval_report import (
    ablation_table,
    cell_rows,
    main_table,
    plot_rows,
    priced_rows,
    student_gains,
    summary_metrics,
)
from collectors.evaluation.priced_eval import PricedCell, PricedMethod
from collectors.evaluation.priced_tasks import calibration_range


def cells(line: str) -> list[str]:
    """A Markdown table line's cells, stripped of tabulate's padding."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(pair, dataset, method, speedup, held_pair=False, held_task=False, calls=(0.0, 1.0)):
    return {
        "pair_id": pair, "dataset_id": dataset, "method": method, "speedup": speedup,
        "priced_speedup": 2 * speedup, "mean_accepted_length": 1.5, "mid_pool_mean": 3.0,
        "historical_pick_share": 0.25, "is_held_out_pair": held_pair, "is_held_out_task": held_task,
        "mid_calls_per_step": list(calls),
    }  # fmt: skip


def _cell(pair, dataset, student, held_pair=False, held_task=False, small=1.0, mid=0.8):
    return [
        _row(pair, dataset, "all-small", small, held_pair, held_task),
        _row(pair, dataset, "all-mid", mid, held_pair, held_task),
        _row(pair, dataset, "student", student, held_pair, held_task, calls=(0.5, 0.25)),
    ]


ROWS = [
    *_cell("b", "y", 1.1, held_task=True),
    *_cell("z", "x", 0.9),
    *_cell("a", "x", 1.5, held_pair=True, held_task=True, small=0.5, mid=1.0),
    *_cell("a", "w", 1.2),
    _row("c", "x", "all-small", 1.0),  # a cell without a student: in no gain or table line
]


def test_gains_per_group_in_cell_order():
    assert student_gains(ROWS) == {
        "held-out task": [pytest.approx(1.1)],
        "fitting": [pytest.approx(0.9), pytest.approx(1.2)],
        "held-out pair and task": [pytest.approx(1.5)],
    }
    priced = student_gains(ROWS, "priced_speedup")
    assert priced["fitting"] == [pytest.approx(0.9), pytest.approx(1.2)]


def test_summary_metrics():
    m = summary_metrics(ROWS)
    assert m["priced_speedup.fitting"] == {
        "student_gain_mean": pytest.approx(1.05),
        "student_gain_best": pytest.approx(1.2),
        "student_gain_worst": pytest.approx(0.9),
        "student_at_least_best_fixed": None,  # these cells have no best fixed schedule
        "student_vs_adaptive_mean": None,  # nor an adaptive row
        "student_vs_adaptive_worst": None,
        "n_cells": 2,
    }
    assert list(m["mean_priced_speedup"]) == ["all-small", "all-mid", "student"]
    assert m["mean_priced_speedup"]["all-small"] == pytest.approx(2 * (1 + 1 + 0.5 + 1 + 1) / 5)
    assert not [k for k in m if k.startswith("speedup") or k == "mean_speedup"]  # priced only


def test_main_table_sorted_by_group_then_cell():
    lines = main_table(ROWS).splitlines()
    assert cells(lines[0])[:4] == ["pair", "dataset", "group", "all-small"] and len(cells(lines[0])) == 17
    assert [cells(line)[:3] for line in lines[2:]] == [
        ["a", "w", "fitting"],
        ["z", "x", "fitting"],
        ["a", "x", "held-out pair and task"],
        ["b", "y", "held-out task"],
    ]
    assert cells(lines[4])[3:] == [
        "1.00x (1.50)", "2.00x (1.50)", "-", "-", "-", "-", "-", "3.00x (1.50)", "-", "-", "+50.0%", "-",
        "-", "-",
    ]  # fmt: skip


def test_student_against_the_best_fixed_schedule_and_its_interval():
    rows = [
        *_cell("a", "x", 1.2),
        {**_row("a", "x", "best-fixed", 1.25), "priced_speedup": 2.5},
        *_cell("a", "y", 1.3),
        {**_row("a", "y", "best-fixed", 1.25), "priced_speedup": 2.5},
    ]
    rows[2] |= {"priced_ci_low": 2.1, "priced_ci_high": 2.7}
    m = summary_metrics(rows)
    assert m["priced_speedup.fitting"]["student_at_least_best_fixed"] == pytest.approx(0.5)
    lines = main_table(rows).splitlines()[2:]
    assert cells(lines[0])[-5:] == ["[2.10, 2.70]", "+20.0%", "-4.0%", "-", "-"]
    assert cells(lines[1])[-5:] == ["-", "+30.0%", "+4.0%", "-", "-"]


def _deployed(row: dict) -> dict:
    return {**row, "method": "deployed", "deployed_as": row["method"]}


def test_the_deployed_row_has_gains_of_its_own_beside_the_students():
    """Cell x: the pair check deployed All-Small, so the deployed row gains 0% where the student
    loses 10%; cell y: it deployed the student, so both gain 30%."""
    x, y = _cell("a", "x", 0.9), _cell("a", "y", 1.3)
    rows = [*x, _deployed(x[0]), *y, _deployed(y[2])]
    m = summary_metrics(rows)
    assert m["priced_speedup.fitting"]["student_gain_worst"] == pytest.approx(0.9)
    assert m["deployed.priced_speedup.fitting"]["student_gain_worst"] == pytest.approx(1.0)
    assert m["deployed.priced_speedup.fitting"]["student_gain_mean"] == pytest.approx((1.0 + 1.3) / 2)
    assert m["deployed.priced_speedup.fitting"]["n_cells"] == 2
    lines = main_table(rows).splitlines()[2:]
    assert cells(lines[0])[-7:] == ["1.80x (1.50)", "2.00x (1.50)", "-", "-10.0%", "-", "+0.0%", "-"]
    assert cells(lines[1])[-7:] == ["2.60x (1.50)", "2.60x (1.50)", "-", "+30.0%", "-", "+30.0%", "-"]


def _priced_cell() -> PricedCell:
    """Two prompts: AR 10 + 30 ms; All-Small 5 + 15 ms (2x), the student 8 + 12 ms (2x), the
    student at a shifted threshold 4 + 16 ms (2x), each with its own statistics."""

    def method(name: str, ms: tuple[float, float], schedule: str = "") -> PricedMethod:
        return PricedMethod(name, schedule, np.array(ms), np.array([4.0, 6.0]), 1.5, (0.5, 0.25))

    methods = {"all-small": method("all-small", (5, 15), "00"), "student": method("student", (8, 12)),
               "student:-0.50": method("student:-0.50", (4, 16))}  # fmt: skip
    return PricedCell(np.array([10.0, 30.0]), np.array([4.0, 6.0]), methods, "")


def test_priced_rows_carry_the_speedup_its_interval_and_the_statistics():
    rows = priced_rows(_priced_cell(), n_boot=50)
    student = rows["student"]
    assert student["priced_speedup"] == pytest.approx(2.0)
    assert student["priced_ci_low"] <= 2.0 <= student["priced_ci_high"]
    assert (student["n_prompts"], student["n_tokens"], student["schedule"]) == (2, 10, "")
    assert student["priced_tokens_per_s"] == pytest.approx(1e3 * 10 / 20)
    assert student["mid_call_rate"] == pytest.approx(0.375) and student["mid_calls_per_step"] == [0.5, 0.25]
    assert "speedup" not in student  # nothing here was decoded for real


def test_cell_rows_drop_the_extra_thresholds_and_copy_the_deployed_method():
    rows = cell_rows(_priced_cell(), 50, "student:-0.50", drop=("student:-0.50",))
    assert [r["method"] for r in rows] == ["all-small", "student", "deployed"]
    shifted = priced_rows(_priced_cell(), 50)["student:-0.50"]
    assert rows[-1] == {**shifted, "method": "deployed", "deployed_as": "student:-0.50"}
    with pytest.raises(ValueError, match="deploys 'all-mid', which this cell did not price"):
        cell_rows(_priced_cell(), 50, "all-mid")


def test_ablation_rows_in_method_order_per_sorted_cell():
    rows = [_row("b", "x", m, 1.0) for m in ("cascade", "full")] + [
        _row("a", "x", m, 1.0) for m in ("overwrite", "no-eg", "student")
    ]
    lines = ablation_table(rows).splitlines()
    assert cells(lines[0]) == [
        "pair",
        "dataset",
        "method",
        "speedup",
        "A",
        "mid pool (nodes)",
        "historical picks",
    ]
    assert [cells(line)[:3] for line in lines[2:]] == [
        ["a", "x", "no-eg"], ["a", "x", "overwrite"], ["b", "x", "full"], ["b", "x", "cascade"],
    ]  # fmt: skip
    assert cells(lines[2]) == ["a", "x", "no-eg", "1.00x", "1.50", "3.0", "25.0%"]
    assert ablation_table([]).count("\n") == 1


def test_plot_rows():
    speed, calls = plot_rows(ROWS, depth=2)
    assert len(speed) == len(ROWS) and speed[0] == {
        "cell": "b/y",
        "method": "all-small",
        "priced_speedup": 2.0,
    }
    assert calls[:2] == [
        {"cell": "b/y", "step": 1, "mid_call_rate": 0.5},
        {"cell": "b/y", "step": 2, "mid_call_rate": 0.25},
    ]
    assert len(calls) == 2 * 4


def test_the_calibration_prompts_follow_the_collect_slice_and_stop_before_the_held_back_ones():
    assert calibration_range(0, 6, 40) == (6, 6)  # the default: questions 6-11, never collected
    assert calibration_range(4, 3, 10) == (7, 3)  # ends exactly at the held-back start: allowed
    with pytest.raises(ValueError, match=r"\[8, 11\) after the collect slice reach the held-back prompts"):
        calibration_range(5, 3, 10)


def test_the_adaptive_row_is_the_chosen_variant_and_the_deployed_row_is_measured_against_it():
    """cell_rows copies the variant the pair's check chose as the ``adaptive`` row; the deployed
    row's gain over it is in the summary and the table's last column."""
    ms = {"all-small": [100.0, 100.0], "all-mid": [90.0, 90.0], "student": [60.0, 60.0],
          "adaptive:0.05:8": [80.0, 80.0], "adaptive:0:4": [75.0, 75.0]}  # fmt: skip
    methods = {n: PricedMethod(n, "", np.asarray(v), np.ones(2), 1.5, (0.5,)) for n, v in ms.items()}
    cell = PricedCell(np.asarray([200.0, 200.0]), np.ones(2), methods, "")
    drop = ("adaptive:0.05:8", "adaptive:0:4")
    rows = [{**r, "pair_id": "a", "dataset_id": "x", "is_held_out_pair": False, "is_held_out_task": False}
            for r in cell_rows(cell, 200, "student", drop, adaptive="adaptive:0:4")]  # fmt: skip
    by_method = {r["method"]: r for r in rows}
    assert set(by_method) == {"all-small", "all-mid", "student", "adaptive", "deployed"}
    assert by_method["adaptive"]["adaptive_as"] == "adaptive:0:4"
    assert by_method["adaptive"]["priced_speedup"] == pytest.approx(400.0 / 150.0)
    m = summary_metrics(rows)["deployed.priced_speedup.fitting"]
    assert m["student_vs_adaptive_mean"] == pytest.approx(150.0 / 120.0)
    assert cells(main_table(rows).splitlines()[2])[-1] == "+25.0%"
    with pytest.raises(ValueError, match="chose the adaptive rule 'adaptive:9:9'"):
        cell_rows(cell, 200, "student", drop, adaptive="adaptive:9:9")
