"""The collect stage's summary: best schedule per report against the better endpoint, its
stability under a bootstrap over prompts, round oracle."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from markdown_rows import md_tables

from collectors.collect.summary import best_stability, half_split, per_report, round_oracle, summarise


def _trajectories(rows: list[tuple[str, int, float, float]]) -> pa.Table:
    """Two identical prompts per trajectory, 10 tokens each, priced to the row's tokens/s."""
    return pa.table(
        {
            "report_id": [r[0] for r in rows],
            "schedule_id": pa.array([r[1] for r in rows], pa.int16()),
            "schedule": [format(r[1], "02b") for r in rows],
            "throughput_tok_per_s": [r[2] for r in rows],
            "mean_accepted_length": [r[3] for r in rows],
            "prompt_n_tokens": [[10, 10] for _ in rows],
            "prompt_latency_ms": [[1e4 / r[2]] * 2 for r in rows],
        }
    )


def _per_prompt(report: str, tokens: list[list[int]], ms: list[list[float]]) -> pa.Table:
    return pa.table(
        {
            "report_id": [report] * len(tokens),
            "schedule_id": pa.array(range(len(tokens)), pa.int16()),
            "prompt_n_tokens": tokens,
            "prompt_latency_ms": ms,
        }
    )


def test_best_schedule_kept_by_every_resample_when_it_wins_on_every_prompt():
    table = _per_prompt("r", [[10, 20, 30], [12, 25, 31]], [[5.0, 9.0, 7.0], [5.0, 9.0, 7.0]])
    assert best_stability(table, seed=0) == {"r": 1.0}


def test_best_schedule_stability_matches_exact_enumeration_of_resamples():
    # schedule 1 wins big on prompt 0 and loses a little on prompts 1 and 2
    tokens = [[10, 10, 10], [30, 9, 9]]
    ms = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    full = 1  # 48 / 30 > 30 / 30
    wins = 0
    for draw in itertools.product(range(3), repeat=3):  # 27 equally likely resamples
        tps = [sum(tokens[s][i] for i in draw) / sum(ms[s][i] for i in draw) for s in (0, 1)]
        wins += (0 if tps[0] >= tps[1] else 1) == full
    exact = wins / 27
    assert 0.2 < exact < 0.8
    got = best_stability(_per_prompt("r", tokens, ms), seed=3, resamples=20000)["r"]
    assert got == pytest.approx(exact, abs=0.015)


def test_half_split_is_exact_on_two_prompts_that_disagree():
    # per prompt tokens/s: schedule 0 gives 1.0 and 1.0, schedule 1 gives 3.0 and 0.9. Chosen on prompt
    # 0, schedule 1 gets 0.9 of prompt 1's best (1.0); chosen on prompt 1, schedule 0 gets 1/3 of
    # prompt 0's best (3.0)
    table = _per_prompt("r", [[10, 10], [30, 9]], [[10.0, 10.0], [10.0, 10.0]])
    assert half_split(table) == {"r": pytest.approx((0.9 + 1 / 3) / 2)}


def test_half_split_pools_a_half_and_loses_nothing_where_one_schedule_wins_every_prompt():
    # 4 prompts: schedule 2 is fastest on each, so on every half and every rest
    tokens = [[10, 10, 10, 10], [10, 20, 10, 10], [12, 21, 11, 13]]
    ms = [[5.0, 9.0, 7.0, 3.0]] * 3
    assert half_split(_per_prompt("r", tokens, ms)) == {"r": 1.0}
    # schedule 1 wins only prompt 1 (2.2x): a half holding prompt 1 picks it, and the rest's best is
    # schedule 0 (equal on the rest, smaller id) or 1; the 3 halves without prompt 1 pick schedule 0
    got = half_split(_per_prompt("r", [[10, 10, 10, 10], [5, 22, 5, 5]], ms[:2]))["r"]
    halves = list(itertools.combinations(range(4), 2))
    exact = 0.0
    for chosen in halves:
        rest = [i for i in range(4) if i not in chosen]
        time = sum(ms[0][i] for i in rest)
        tps = [sum(([10] * 4, [5, 22, 5, 5])[s][i] for i in rest) / time for s in (0, 1)]
        pick = 1 if 1 in chosen else 0
        exact += tps[pick] / max(tps)
    assert got == pytest.approx(exact / len(halves)) and got < 1.0


def test_half_split_skips_a_report_of_one_prompt():
    assert half_split(_per_prompt("r", [[10], [12]], [[5.0], [5.0]])) == {}


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
    [table] = md_tables(text)
    assert table[1:] == [
        ["b", "50.0 (1.00)", "40.0 (3.00)", "01", "60.0 (2.00)", "1.200x", "100%", "100.0%", "-"],
        ["a", "30.0 (1.00)", "20.0 (2.00)", "00", "30.0 (1.00)", "1.000x", "100%", "100.0%", "1.00x"],
    ]
    assert metrics["n_reports"] == 2 and metrics["n_trajectories"] == 6 and metrics["n_round_outcomes"] == 2
    assert metrics["mean_best_over_better_endpoint"] == pytest.approx(1.1)
    assert metrics["reports"]["b"] == {
        "best_schedule": "01",
        "best_over_better_endpoint": pytest.approx(1.2),
        "best_kept": 1.0,
        "half_split": 1.0,
    }
    assert metrics["mean_half_split"] == metrics["min_half_split"] == 1.0
