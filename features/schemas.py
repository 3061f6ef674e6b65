"""The learning stages' tables, declared once (same helper and conventions as collectors/schemas.py).

- ``states``: one row per canonical state (report, step k, schedule prefix a_<k), features = the
  mean over the merged action rows, ``n_rows`` merged, ``fold_id`` the grouped fold of the report.
  ``state_id`` is the row index (rows sorted by report_id, step, prefix).
- ``samples``: one row per collected action row (state, action, future suffix, realised outcome),
  keyed to its state by ``state_id``; what the value system and the signal proxy train on.
- ``margins``: one row per state; value-system margins (exhaustive suffix search) and the oracle
  margins read from the enumerated trajectories. Throughputs are tokens/s.

Value contracts (features/contracts.py), from features/canonical.py and pipeline/margins.py: per
report 2^D - 1 states whose ``n_rows`` add up to its 2^D x D action rows, ``state_id`` = row index,
one sample per action row; margins one row per state, every throughput finite.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from decoder.core.state import state_feature_names
from features.collect_schemas import schedule_step_rules, state_feature_rules
from features.contracts import (
    Contract,
    GroupRule,
    Rule,
    bits_text,
    constant_per,
    in_range,
    non_negative,
    rows_per,
)
from features.tables import TableSpec

SCHEMA_VERSION = "v2"  # v2: the history's ngram_match_frac (the n-gram lookahead) where mid_calls_frac was

_STATE_KEYS = (
    ("report_id", pa.string()),
    ("pair_id", pa.string()),
    ("dataset_id", pa.string()),
    ("state_id", pa.int32()),
    ("fold_id", pa.int8()),
    ("step", pa.int8()),
    ("prefix", pa.string()),
)


_STATE = ("report_id", "step", "prefix")


def _state_key_rules(depth: int) -> tuple[Rule, ...]:
    return (
        Rule("state_id", "the row index", pl.col("state_id") == pl.int_range(pl.len())),
        *non_negative("fold_id"),
        in_range("step", 1, depth),
        bits_text("prefix", pl.col("step").cast(pl.Int64) - 1),
    )


def _per_report_states(depth: int) -> GroupRule:
    return rows_per(("report_id",), 2**depth - 1, f"2^D - 1 = {2**depth - 1}")


def states_spec(depth: int) -> TableSpec:
    return TableSpec(
        "states",
        f"{SCHEMA_VERSION}-D{depth}",
        (
            *_STATE_KEYS,
            ("n_rows", pa.int32()),
            *((n, pa.float64()) for n in state_feature_names(depth)),
        ),
        Contract(
            key=("state_id",),
            rules=(
                *_state_key_rules(depth),
                Rule("n_rows", ">= 1", pl.col("n_rows") >= 1),
                *state_feature_rules(depth),
            ),
            groups=(
                _per_report_states(depth),
                GroupRule(_STATE, "prefix", "one state per (report, step, prefix)", pl.len() == 1),
                GroupRule(
                    ("report_id",),
                    "n_rows",
                    f"2^D x D = {2**depth * depth} action rows per report",
                    pl.col("n_rows").sum() == 2**depth * depth,
                ),
                *constant_per(("report_id",), ("pair_id", "dataset_id", "fold_id")),
            ),
        ),
    )


def samples_spec(depth: int) -> TableSpec:
    return TableSpec(
        "samples",
        f"{SCHEMA_VERSION}-D{depth}",
        (
            *_STATE_KEYS,
            ("schedule_id", pa.int16()),
            ("is_invoke", pa.bool_()),
            ("suffix", pa.string()),
            ("mean_accepted_length", pa.float64()),
            ("round_latency_ms", pa.float64()),
            ("throughput_tok_per_s", pa.float64()),
        ),
        Contract(
            key=("report_id", "schedule_id", "step"),
            rules=(
                *schedule_step_rules(depth),
                *non_negative("state_id", "fold_id", "mean_accepted_length", "throughput_tok_per_s"),
                Rule("round_latency_ms", "> 0", pl.col("round_latency_ms") > 0),
            ),
            groups=(
                rows_per(("report_id",), 2**depth * depth, f"2^D x D = {2**depth * depth}"),
                *constant_per(_STATE, ("state_id",)),
                *constant_per(("report_id", "schedule_id"), ("mean_accepted_length", "round_latency_ms")),
                *constant_per(("report_id",), ("pair_id", "dataset_id", "fold_id")),
            ),
        ),
    )


def margins_spec(depth: int) -> TableSpec:
    return TableSpec(
        "margins",
        f"{SCHEMA_VERSION}-D{depth}",
        (
            *_STATE_KEYS,
            ("value_invoke_tok_per_s", pa.float64()),
            ("value_skip_tok_per_s", pa.float64()),
            ("value_invoke_suffix", pa.string()),
            ("value_skip_suffix", pa.string()),
            ("margin_value_tok_per_s", pa.float64()),
            ("margin_value_oof_tok_per_s", pa.float64()),
            ("margin_value_by_fold_tok_per_s", pa.list_(pa.float64())),
            ("oracle_invoke_tok_per_s", pa.float64()),
            ("oracle_skip_tok_per_s", pa.float64()),
            ("margin_oracle_tok_per_s", pa.float64()),
        ),
        Contract(
            key=("state_id",),
            rules=_state_key_rules(depth),
            groups=(_per_report_states(depth),),
        ),
    )
