"""The collect stage's summary: best schedule per report against the better endpoint, round oracle."""

from __future__ import annotations

import pyarrow as pa
import pytest

from collectors.summary import per_report, round_oracle, summarise


def _trajectories(rows: list[tuple[str, int, float, float]]) -> pa.Table:
    return pa.table(
        {
            "report_id": [r[0] for r in rows],
            "schedule_id": pa.array([r[1] for r in rows], pa.int16()),
            "schedule": [format(r[1], "02b") for r in rows],
            "throughput_tok_per_s": [r[2] for r in rows],
            "mean_accepted_length": [r[3] for r in rows],
        }
    )


def _rounds(rows: list[tuple[str, int, int, int, float]]) -> pa.Table:
    names = ["report_id", "prompt_id", "start_position", "schedule_id", "throughput_tok_per_s"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


TRAJ = _trajectories(
    [
        ("b", 3, 40.0, 3.0),  # All-Mid of b (largest id), rows in any order
        ("b", 0, 50.0, 1.0),
        ("b", 1, 60.0, 2.0),
        ("b", 2, 60.0, 2.5),  # ties with schedule 1: the smaller id wins
        ("a", 0, 30.0, 1.0),
        ("a", 1, 20.0, 2.0),
    ]
)


def test_best_schedule_ties_and_gain_per_report_in_first_seen_order():
    table = per_report(TRAJ)
    assert table["report_id"].to_list() == ["b", "a"]
    b, a = table.to_dicts()
    assert (b["small_tps"], b["mid_tps"], b["best_schedule"], b["best_a"]) == (50.0, 40.0, "01", 2.0)
    assert b["gain"] == pytest.approx(60 / 50)
    assert (a["mid_tps"], a["best_schedule"], a["gain"]) == (20.0, "00", 1.0)


def test_round_oracle_is_the_mean_over_round_starts():
    rounds = _rounds(
        [
            ("a", 0, 0, 0, 10.0), ("a", 0, 0, 1, 30.0), ("a", 0, 0, 3, 20.0),  # 30 / 20
            ("a", 1, 5, 0, 40.0), ("a", 1, 5, 1, 10.0), ("a", 1, 5, 3, 10.0),  # 40 / 40
        ]
    )  # fmt: skip
    assert round_oracle(rounds) == {"a": pytest.approx((1.5 + 1.0) / 2)}


def test_summary_lines_and_metrics():
    rounds = _rounds([("a", 0, 0, 0, 10.0), ("a", 0, 0, 1, 30.0)])  # schedule 1 is the largest id here
    text, metrics = summarise(TRAJ, rounds)
    assert "| b | 50.0 (1.00) | 40.0 (3.00) | 01 | 60.0 (2.00) | 1.200x | - |" in text
    assert "| a | 30.0 (1.00) | 20.0 (2.00) | 00 | 30.0 (1.00) | 1.000x | 1.00x |" in text
    assert metrics["n_reports"] == 2 and metrics["n_trajectories"] == 6 and metrics["n_round_outcomes"] == 2
    assert metrics["mean_best_over_better_endpoint"] == pytest.approx(1.1)
    assert metrics["reports"]["b"] == {"best_schedule": "01", "best_over_better_endpoint": pytest.approx(1.2)}
