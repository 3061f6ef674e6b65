"""The collectors' three tables, declared once. Units in names, keys end in _id, flags in is_."""

from __future__ import annotations

import pyarrow as pa

from decoder.state import state_feature_names
from features.tables import TableSpec

SCHEMA_VERSION = "v3"  # v2: per-prompt tokens and priced milliseconds (the bootstrap over prompts);
# v3: the history's ngram_match_frac (the n-gram lookahead) where mid_calls_frac was
ROUNDS_VERSION = "v6"  # v2: prompt_tokens, mid_lag, latency priced with the lag's catch-up; v3: decision_ms;
# v4: decision_cold_ms; v5: each step's signals end with the n-gram lookahead (decoder.state.RECORDED_NAMES);
# v6: prompt_blocks (the prompt rows the round computes, in its latency)
MAX_DEPTH = 8  # schedule ids are int16 bit sets: 2^D schedules, D steps per round

_KEYS = (("report_id", pa.string()), ("pair_id", pa.string()), ("dataset_id", pa.string()))
_OUTCOME = (
    ("mean_accepted_length", pa.float64()),
    ("round_latency_ms", pa.float64()),
    ("throughput_tok_per_s", pa.float64()),
)

TRAJECTORIES = TableSpec(
    "trajectories",
    SCHEMA_VERSION,
    (
        *_KEYS,
        ("schedule_id", pa.int16()),
        ("schedule", pa.string()),
        ("mode", pa.string()),
        ("profile_id", pa.string()),
        ("n_prompts", pa.int32()),
        ("n_rounds", pa.int32()),
        ("n_tokens", pa.int32()),
        *_OUTCOME,
        ("tokens_per_round", pa.float64()),
        ("n_small_steps", pa.int32()),
        ("n_mid_calls", pa.int32()),
        ("mid_tokens", pa.int64()),
        ("mid_catch_up_tokens", pa.int64()),
        ("verified_nodes", pa.int64()),
        ("mid_call_tokens", pa.list_(pa.int32())),
        ("verified_nodes_per_round", pa.list_(pa.int32())),
        ("prompt_n_tokens", pa.list_(pa.int32())),
        ("prompt_latency_ms", pa.list_(pa.float64())),
        ("measured_round_latency_ms", pa.float64()),
        ("measured_throughput_tok_per_s", pa.float64()),
    ),
)


def actions_spec(depth: int) -> TableSpec:
    """One row per (report, schedule, step): state before the step, action, trajectory outcome."""
    return TableSpec(
        "actions",
        f"{SCHEMA_VERSION}-D{depth}",
        (
            *_KEYS,
            ("schedule_id", pa.int16()),
            ("step", pa.int8()),
            ("is_invoke", pa.bool_()),
            ("prefix", pa.string()),
            ("suffix", pa.string()),
            *((n, pa.float64()) for n in state_feature_names(depth)),
            *_OUTCOME,
        ),
    )


def rounds_spec(depth: int) -> TableSpec:
    """Replay's round-level table: every schedule's outcome from every visited round start.

    ``prompt_tokens``: the prompt's own length; ``mid_lag``: committed tokens the mid drafter's
    cache lacks at this start (collectors.replay.arrival_lag); ``round_latency_ms`` prices the
    round as execute mode would with that lag (its first mid call also catches up ``mid_lag``)
    and the ``prompt_blocks`` of the prompt's top-m rows it reads that the arrival the lag comes
    from had not read (collectors.replay.arrival), one scheduler decision per step included;
    ``decision_ms``: the profile's cost of one decision, ``decision_cold_ms``: its extra once per
    round that decides (a fixed schedule, deciding nothing, pays neither).
    """
    return TableSpec(
        "rounds",
        f"{ROUNDS_VERSION}-D{depth}",
        (
            *_KEYS,
            ("prompt_id", pa.int32()),
            ("prompt_tokens", pa.int32()),
            ("start_position", pa.int32()),
            ("mid_lag", pa.int32()),
            ("schedule_id", pa.int16()),
            ("accepted", pa.int16()),
            ("verified_nodes", pa.int16()),
            ("mid_call_tokens", pa.list_(pa.int32())),
            ("n_small_steps", pa.int8()),
            ("prompt_blocks", pa.int16()),
            ("round_latency_ms", pa.float64()),
            ("decision_ms", pa.float64()),
            ("decision_cold_ms", pa.float64()),
            ("throughput_tok_per_s", pa.float64()),
            ("is_round_best", pa.bool_()),
            ("signals", pa.list_(pa.float32())),
        ),
    )
