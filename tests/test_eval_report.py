"""Evaluation tables from result rows: cell order, groups, ablation order, plot rows."""

from __future__ import annotations

import pytest

from collectors.evaluation.eval_report import (
    ablation_table,
    main_table,
    plot_rows,
    pricing_agreement,
    student_gains,
    summary_metrics,
    wall_table,
)
from collectors.evaluation.priced_tasks import calibration_range


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
    assert m["speedup.fitting"] == {
        "student_gain_mean": pytest.approx(1.05),
        "student_gain_best": pytest.approx(1.2),
        "student_gain_worst": pytest.approx(0.9),
        "student_at_least_best_fixed": None,  # these cells have no best fixed schedule
        "n_cells": 2,
    }
    assert list(m["mean_speedup"]) == ["all-small", "all-mid", "student"]
    assert m["mean_speedup"]["all-small"] == pytest.approx((1 + 1 + 0.5 + 1 + 1) / 5)


def test_main_table_sorted_by_group_then_cell():
    lines = main_table(ROWS, "speedup").splitlines()[2:]
    assert [line.split(" | ")[:3] for line in lines] == [
        ["| a", "w", "fitting"],
        ["| z", "x", "fitting"],
        ["| a", "x", "held-out pair and task"],
        ["| b", "y", "held-out task"],
    ]
    assert lines[2].endswith(
        "| 0.50x (1.50) | 1.00x (1.50) | - | - | - | 1.50x (1.50) | - | - | +50.0% | - | - |"
    )
    priced = main_table(ROWS).splitlines()[2:]  # the default: priced speedup, twice the wall here
    assert priced[2].endswith(
        "| 1.00x (1.50) | 2.00x (1.50) | - | - | - | 3.00x (1.50) | - | - | +50.0% | - | - |"
    )


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
    assert lines[0].endswith("| [2.10, 2.70] | +20.0% | -4.0% | - |")
    assert lines[1].endswith("| - | +30.0% | +4.0% | - |")


def _deployed(row: dict) -> dict:
    return {**row, "method": "deployed", "deployed_as": row["method"]}


def test_the_deployed_row_has_gains_of_its_own_beside_the_students():
    """Cell x: the pair check deployed All-Small, so the deployed row gains 0% where the student
    loses 10%; cell y: it deployed the student, so both gain 30%."""
    x, y = _cell("a", "x", 0.9), _cell("a", "y", 1.3)
    rows = [*x, _deployed(x[0]), *y, _deployed(y[2])]
    m = summary_metrics(rows)
    assert m["speedup.fitting"]["student_gain_worst"] == pytest.approx(0.9)
    assert m["deployed.speedup.fitting"]["student_gain_worst"] == pytest.approx(1.0)
    assert m["deployed.speedup.fitting"]["student_gain_mean"] == pytest.approx((1.0 + 1.3) / 2)
    assert m["deployed.priced_speedup.fitting"]["n_cells"] == 2
    lines = main_table(rows, "speedup").splitlines()[2:]
    assert lines[0].endswith("| 0.90x (1.50) | 1.00x (1.50) | - | -10.0% | - | +0.0% |")
    assert lines[1].endswith("| 1.30x (1.50) | 1.30x (1.50) | - | +30.0% | - | +30.0% |")


def _walled(row, decode, priced, beside=None, wall_of=None):
    return {**row, "wall_ci_low": 1.0, "wall_ci_high": 1.4, "wall_decode_speedup": decode,
            "wall_priced_speedup": priced, "wall_beside_priced_speedup": beside, "wall_n_prompts": 3,
            "wall_of": wall_of or row["method"]}  # fmt: skip


def test_wall_table_leaves_out_the_deployed_copies():
    """Cell x deploys the student at the exported threshold (a copy of its row: left out); cell y a
    shifted student, decoded under the name deployed (kept)."""
    student = _walled(_row("a", "x", "student", 1.2), 1.25, 1.375, 1.25)
    shifted = _walled({**_row("a", "y", "deployed", 1.5), "deployed_as": "student:0.50"}, 1.5, 1.2)
    lines = wall_table([student, _deployed(student), shifted]).splitlines()
    assert lines[2:] == [
        "| a | x | student | 3 | 1.20x | [1.00, 1.40] | 1.25x | 1.38x | 1.10 | 1.00 |",
        "| a | y | deployed | 3 | 1.50x | [1.00, 1.40] | 1.50x | 1.20x | 0.80 | - |",
    ]


def test_pricing_agreement_counts_the_decoded_rows_in_the_band_per_profile():
    """With the stage profile, priced / wall 1.04 (in the band) and 0.80 (out); re-profiled, 1.00
    (in), the shifted row has no figure; copies and priced-only rows are not counted."""
    student = _walled(_row("a", "x", "student", 1.2), 1.25, 1.3, 1.25)
    shifted = _walled({**_row("a", "y", "deployed", 1.5), "deployed_as": "student:0.50"}, 1.5, 1.2)
    priced_only = {**_row("a", "x", "10101", 1.0), "speedup": None}
    agreement = pricing_agreement([student, _deployed(student), shifted, priced_only])
    stage = {"rows": 2, "within": 1, "min": 0.8, "median": 0.92, "max": 1.04}
    assert agreement["stage"] == {k: pytest.approx(v) for k, v in stage.items()}
    assert agreement["beside"] == {"rows": 1, "within": 1, "min": 1.0, "median": 1.0, "max": 1.0}
    assert pricing_agreement([priced_only]) == {}


def test_wall_table_sets_the_real_runs_beside_their_pricing():
    """A row without a re-profiled figure (a run before it existed) shows '-' there."""
    rows = [
        {**_row("a", "x", "student", 1.2), "wall_ci_low": 1.0, "wall_ci_high": 1.4,
         "wall_decode_speedup": 1.25, "wall_priced_speedup": 1.375, "wall_n_prompts": 3},
        {**_row("a", "x", "10101", 1.0), "speedup": None},  # priced only: not in the wall table
    ]  # fmt: skip
    lines = wall_table(rows).splitlines()
    assert lines[2:] == ["| a | x | student | 3 | 1.20x | [1.00, 1.40] | 1.25x | 1.38x | 1.10 | - |"]


def test_ablation_rows_in_method_order_per_sorted_cell():
    rows = [_row("b", "x", m, 1.0) for m in ("cascade", "full")] + [
        _row("a", "x", m, 1.0) for m in ("overwrite", "no-eg", "student")
    ]
    lines = ablation_table(rows).splitlines()[2:]
    assert [line.split(" | ")[:3] for line in lines] == [
        ["| a", "x", "no-eg"], ["| a", "x", "overwrite"], ["| b", "x", "full"], ["| b", "x", "cascade"],
    ]  # fmt: skip
    assert lines[0] == "| a | x | no-eg | 1.00x | 1.50 | 3.0 | 25.0% |"
    assert ablation_table([]).count("\n") == 1


def test_plot_rows():
    speed, calls = plot_rows(ROWS, depth=2)
    assert len(speed) == len(ROWS) and speed[0] == {
        "cell": "b/y",
        "method": "all-small",
        "priced_speedup": 2.0,
        "speedup": 1.1 / 1.1,
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
