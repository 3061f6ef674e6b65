"""The learning stages' tables, declared once (same helper and conventions as collectors/schemas.py).

- ``states``: one row per canonical state (report, step k, schedule prefix a_<k), features = the
  mean over the merged action rows, ``n_rows`` merged, ``fold_id`` the grouped fold of the report.
  ``state_id`` is the row index (rows sorted by report_id, step, prefix).
- ``samples``: one row per collected action row (state, action, future suffix, realised outcome),
  keyed to its state by ``state_id``; what the value system and the signal proxy train on.
- ``margins``: one row per state; value-system margins (exhaustive suffix search) and the oracle
  margins read from the enumerated trajectories. Throughputs are tokens/s.
"""

from __future__ import annotations

import pyarrow as pa

from decoder.state import state_feature_names
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


def states_spec(depth: int) -> TableSpec:
    return TableSpec(
        "states",
        f"{SCHEMA_VERSION}-D{depth}",
        (
            *_STATE_KEYS,
            ("n_rows", pa.int32()),
            *((n, pa.float64()) for n in state_feature_names(depth)),
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
    )
