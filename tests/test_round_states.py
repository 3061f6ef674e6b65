"""Round-level states from a hand-made round table (D = 2): one state per (start, step, prefix),
the round's own signals, history from the prefix and the start's lag, margins by suffix search."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute
import pytest

from decoder.core.policies import schedule_bits
from decoder.core.state import RECORDED_NAMES
from features.collect_schemas import rounds_spec
from features.round_states import report_context, round_outcomes, round_states, round_walk_pct
from features.tables import to_table

D = 2
# accepted tokens and priced ms per schedule (step 1 first): values 1000 * (A + 1) / ms
OUTCOME = {"00": (2, 30.0), "01": (3, 50.0), "10": (4, 40.0), "11": (4, 60.0)}
VALUE = {s: 1e3 * (a + 1) / ms for s, (a, ms) in OUTCOME.items()}  # 100, 80, 125, 83.3
# a hard stretch of text: the n-gram drafter alone gets 1 token per round, the best schedule 4
HARD = {"00": (0, 30.0), "01": (1, 50.0), "10": (3, 40.0), "11": (4, 60.0)}


def _bits(sid: int) -> str:
    return "".join("1" if b else "0" for b in schedule_bits(sid, D))


def _signals(prefix: str, start: int) -> list[float]:
    """Distinct per (start, step, prefix): what the tree looked like before that step."""
    return [
        100 * start + 10 * len(prefix) + int(prefix or "0", 2) + j / 100 for j in range(len(RECORDED_NAMES))
    ]


def _rounds(drop: int | None = None, at_24: dict = OUTCOME, at_20: dict = OUTCOME, catch_up: float = 0.0):
    """The table; ``catch_up``: ms of each calling round's priced ms that its lag's catch-up costs."""
    rows = []
    for start in (20, 24):
        for sid in range(2**D):
            if sid == drop and start == 24:
                continue
            bits = _bits(sid)
            a, ms = (at_20 if start == 20 else at_24)[bits]
            rows.append(
                {
                    "report_id": "r",
                    "pair_id": "p",
                    "dataset_id": "d",
                    "prompt_id": 0,
                    "prompt_tokens": 20,
                    "start_position": start,
                    "mid_lag": 7 if start == 24 else 19,
                    "schedule_id": sid,
                    "accepted": a,
                    "verified_nodes": a + 3,
                    "mid_call_tokens": [5] * bits.count("1"),
                    "n_small_steps": bits.count("0"),
                    "prompt_blocks": 0,
                    "round_latency_ms": ms,
                    "catch_up_ms": catch_up if "1" in bits else 0.0,
                    "decision_ms": 0.01,
                    "decision_cold_ms": 0.02,
                    "throughput_tok_per_s": 1e3 * (a + 1) / ms,
                    "is_round_best": bits == "10",
                    "signals": [x for k in range(1, D + 1) for x in _signals(bits[: k - 1], start)],
                }
            )
    return to_table(rounds_spec(D), rows)


CONTEXT = report_context(
    pl.DataFrame({"report_id": ["r", "r"], "target_ms": [12.0, 12.0], "mid_ms": [3.0, 3.0]}).with_columns(
        log_target_mid_ratio=pl.lit(math.log(4.0))
    ),
    pl.DataFrame({"report_id": ["r"], "fold_id": [2]}),
)


def test_one_state_per_start_step_and_prefix_with_the_rounds_own_values():
    states = round_states(_rounds(), CONTEXT, D)
    assert states.height == 2 * (2**D - 1)
    row = {
        (s, k, p): r
        for s, k, p, r in zip(
            states["start_position"],
            states["step"],
            states["prefix"],
            states.iter_rows(named=True),
            strict=True,
        )
    }
    for (start, k, prefix), r in row.items():
        # the candidate signals and the lookahead (a history feature) are the round's own
        assert [r[n] for n in RECORDED_NAMES] == pytest.approx(_signals(prefix, start), rel=1e-6)
        assert r["log_prompt_tokens"] == math.log1p(20) and r["target_ms"] == 12.0 and r["fold_id"] == 2
        assert r["step_frac"] == k / D and r["called_step_1"] == float(prefix == "1")
        lag = 7 if start == 24 else 19
        assert r["log_mid_lag"] == (0.0 if "1" in prefix else math.log1p(lag))  # a call caught it up
    first = row[20, 1, ""]
    assert first["invoke_tok_per_s"] == pytest.approx(max(VALUE["10"], VALUE["11"]))
    assert first["skip_tok_per_s"] == pytest.approx(max(VALUE["00"], VALUE["01"]))
    assert first["margin_relative"] == pytest.approx((125 - 100) / 125)
    after_mid = row[20, 2, "1"]
    assert after_mid["invoke_tok_per_s"] == pytest.approx(VALUE["11"])
    assert after_mid["skip_tok_per_s"] == pytest.approx(VALUE["10"])
    assert after_mid["margin_tok_per_s"] < 0


def test_round_walk_reaches_the_schedule_its_decisions_spell():
    states = round_states(_rounds(), CONTEXT, D)
    outcomes = round_outcomes(_rounds())
    skip = states.with_columns(is_invoke=pl.lit(False))
    assert round_walk_pct(skip, outcomes, D) == pytest.approx(100 * VALUE["00"] / VALUE["10"])
    right = states.with_columns(is_invoke=pl.col("margin_tok_per_s") > 0)
    assert round_walk_pct(right, outcomes, D) == pytest.approx(100.0)  # the greedy walk on true margins


def test_a_hard_start_weighs_by_the_time_per_token_it_costs():
    """A decoder spends ms / tokens per token of text at a start: the hard start (1 token per
    All-Small round) costs 30 ms per token, the easy one 10, so it weighs 3x in the walk. A mean of
    per-start ratios (80% and 33%) or summed tokens and ms would give other numbers."""
    rounds = _rounds(at_24=HARD)
    skip = round_states(rounds, CONTEXT, D).with_columns(is_invoke=pl.lit(False))
    per_token = {s: ms / (a + 1) for s, (a, ms) in HARD.items()}  # 30, 25, 10, 12
    oracle = 40 / 5 + min(per_token.values())  # 8 ms per token at start 20 ("10"), 10 at 24
    pct = round_walk_pct(skip, round_outcomes(rounds), D)
    assert pct == pytest.approx(100 * oracle / (30 / 3 + per_token["00"]))  # 45%
    assert pct != pytest.approx(100 * (VALUE["00"] / VALUE["10"] + 10 / 30) / 2)


def test_bad_round_tables_are_refused():
    with pytest.raises(ValueError, match="schedules, not 4"):
        round_states(_rounds(drop=1), CONTEXT, D)
    with pytest.raises(ValueError, match="no canonical states"):
        round_states(_rounds(), CONTEXT.with_columns(report_id=pl.lit("other")), D)
    varying = pl.DataFrame(
        {
            "report_id": ["r", "r"],
            "target_ms": [12.0, 13.0],
            "mid_ms": [3.0, 3.0],
            "log_target_mid_ratio": [1.0, 1.0],
        }
    )
    with pytest.raises(ValueError, match="target_ms is not one value"):
        report_context(varying, pl.DataFrame({"report_id": ["r"], "fold_id": [0]}))
    assert np.isfinite(round_states(_rounds(), CONTEXT, D)["margin_relative"].to_numpy()).all()


def test_suffix_margin_follows_the_reports_best_continuation_not_the_rounds():
    """With the hard start at 24, the report's best continuation after '0' is '01' (ms per token
    summed over both starts: 12.5 + 25 against 10 + 30 for '00'), after '1' it is '10' (8 + 10
    against 12 + 12). At start 20 the skip branch is then valued at '01' (80 tokens/s), though '00'
    (100) is that round's best: the suffix margin is 125 - 80, the round maximum's 125 - 100."""
    states = round_states(_rounds(at_24=HARD), CONTEXT, D)
    keys = zip(states["start_position"], states["step"], states["prefix"], strict=True)
    row = dict(zip(keys, states.iter_rows(named=True), strict=True))
    first = row[20, 1, ""]
    assert first["margin_suffix_tok_per_s"] == pytest.approx(VALUE["10"] - VALUE["01"])
    assert first["margin_suffix_relative"] == pytest.approx((VALUE["10"] - VALUE["01"]) / VALUE["10"])
    assert first["margin_tok_per_s"] == pytest.approx(VALUE["10"] - VALUE["00"])
    hard = {s: 1e3 * (a + 1) / ms for s, (a, ms) in HARD.items()}
    assert row[24, 1, ""]["margin_suffix_tok_per_s"] == pytest.approx(hard["10"] - hard["01"])
    last = [r for key, r in row.items() if key[1] == D]  # at the last step no suffix is left to choose
    assert len(last) == 4
    for r in last:
        assert r["margin_suffix_tok_per_s"] == pytest.approx(r["margin_tok_per_s"])


def test_suffix_and_round_margins_agree_on_a_report_of_one_start():
    one = _rounds().filter(pa.compute.equal(_rounds()["start_position"], 20))
    states = round_states(one, CONTEXT, D)
    assert states["margin_suffix_relative"].to_numpy() == pytest.approx(states["margin_relative"].to_numpy())


def test_the_catch_up_is_left_out_of_the_margins_where_the_best_fixed_schedule_pays_it_anyway():
    """Every calling round's 10 ms of catch-up: where the report's best fixed schedule calls the mid
    drafter ('10'), its continuation catches the lag up whichever branch a round takes, so the
    margins value each round as if caught up (invoke at start 20: '10' at 5 tokens / 30 ms). Where
    All-Small is the best fixed schedule only calling pays it, and the margins keep it."""
    calls = round_states(_rounds(catch_up=10.0), CONTEXT, D)
    first = calls.filter((pl.col("start_position") == 20) & (pl.col("step") == 1)).row(0, named=True)
    assert first["invoke_tok_per_s"] == pytest.approx(max(5e3 / 30, 5e3 / 50))
    assert first["skip_tok_per_s"] == pytest.approx(max(VALUE["00"], 4e3 / 40))
    assert first["margin_suffix_tok_per_s"] == pytest.approx(5e3 / 30 - VALUE["00"])
    cheap = {**OUTCOME, "00": (4, 20.0)}  # All-Small: 4 ms per token, the best fixed schedule
    small = round_states(_rounds(at_24=cheap, at_20=cheap, catch_up=10.0), CONTEXT, D)
    first = small.filter((pl.col("start_position") == 20) & (pl.col("step") == 1)).row(0, named=True)
    assert first["invoke_tok_per_s"] == pytest.approx(VALUE["10"])  # charged: 5 tokens / 40 ms
    assert first["margin_suffix_tok_per_s"] == pytest.approx(VALUE["10"] - 250.0)
