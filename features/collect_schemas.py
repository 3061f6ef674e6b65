"""The collectors' four tables, declared once. Units in names, keys end in _id, flags in is_.

Each spec carries its value contract (features/contracts.py), derived from how collectors/collect/records.py
and collectors/collect/report.py build the rows: per report, 2^D trajectories (one per schedule), 2^D x D
action rows (one per schedule and step k = 1..D) and 2^D round rows per visited round start; a row's
schedule id, step, flags and bit strings agree; costs, counts and latencies are non-negative. And
per report, in replay mode, the target's greedy continuation of each prompt (one row a prompt; none
in execute mode), which later stages take instead of decoding it again.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from config.params import COLLECT_MODES
from decoder.core.state import CONTEXT_NAMES, RECORDED_NAMES, state_feature_names
from features.contracts import (
    Contract,
    GroupRule,
    Rule,
    bits_text,
    constant_per,
    elements_non_negative,
    in_range,
    non_negative,
    positive,
    rows_per,
)
from features.tables import TableSpec

SCHEMA_VERSION = "v3"  # v2: per-prompt tokens and priced milliseconds (the bootstrap over prompts);
# v3: the history's ngram_match_frac (the n-gram lookahead) where mid_calls_frac was
ROUNDS_VERSION = "v7"  # v2: prompt_tokens, mid_lag, latency priced with the lag's catch-up; v3: decision_ms;
# v4: decision_cold_ms; v5: each step's signals end with the n-gram lookahead
# (decoder.core.state.RECORDED_NAMES); v6: prompt_blocks (the prompt rows the round computes, in its latency);
# v7: catch_up_ms (the part of the latency the lag's catch-up costs)
MAX_DEPTH = 8  # schedule ids are int16 bit sets: 2^D schedules, D steps per round

_KEYS = (("report_id", pa.string()), ("pair_id", pa.string()), ("dataset_id", pa.string()))
_OUTCOME = (
    ("mean_accepted_length", pa.float64()),
    ("round_latency_ms", pa.float64()),
    ("throughput_tok_per_s", pa.float64()),
)

_REPORT = ("report_id",)
_OUTCOME_RULES = (
    *non_negative("mean_accepted_length", "throughput_tok_per_s"),
    *positive("round_latency_ms"),
)


def bits_value(column: str, width: int) -> pl.Expr:
    """The integer a '0'/'1' string spells, character j worth 2^j (decoder.core.policies.schedule_bits)."""
    return pl.sum_horizontal(
        (pl.col(column).str.slice(j, 1) == "1").cast(pl.Int64) * (2**j) for j in range(width)
    )


def pow2(exponent: pl.Expr) -> pl.Expr:
    return (2.0 ** exponent.cast(pl.Float64)).cast(pl.Int64)


def popcount(column: str, width: int) -> pl.Expr:
    return pl.sum_horizontal((pl.col(column).cast(pl.Int64) // (2**j)) % 2 for j in range(width))


def entries_per(column: str, count: str, unit: str, total: str | None = None) -> tuple[Rule, ...]:
    """A list column holds one entry per ``unit`` (``count`` of them) and, given ``total``, sums to it."""
    entries = pl.col(column).list
    length = Rule(column, f"one entry per {unit}", entries.len() == pl.col(count))
    if total is None:
        return (length,)
    return length, Rule(column, f"sums to {total}", entries.sum() == pl.col(total))


def _trajectory_contract() -> Contract:
    length = pl.col("schedule").str.len_chars()
    return Contract(
        key=("report_id", "schedule_id"),
        non_finite=frozenset({"measured_round_latency_ms", "measured_throughput_tok_per_s"}),
        rules=(
            bits_text("schedule", length),
            Rule("schedule", f"1 to {MAX_DEPTH} steps", length.is_between(1, MAX_DEPTH)),
            Rule(
                "schedule_id",
                "the schedule's bits",
                pl.col("schedule_id") == bits_value("schedule", MAX_DEPTH),
            ),
            Rule("mode", f"one of {COLLECT_MODES}", pl.col("mode").is_in(COLLECT_MODES)),
            *positive("n_prompts", "n_rounds"),
            *non_negative("n_tokens", "tokens_per_round", "n_small_steps", "n_mid_calls", "mid_tokens"),
            *non_negative("mid_catch_up_tokens", "verified_nodes"),
            *non_negative("measured_round_latency_ms", "measured_throughput_tok_per_s"),
            *_OUTCOME_RULES,
            *elements_non_negative("mid_call_tokens", "verified_nodes_per_round", "prompt_n_tokens"),
            *elements_non_negative("prompt_latency_ms"),
            *entries_per("mid_call_tokens", "n_mid_calls", "mid call", total="mid_tokens"),
            *entries_per("verified_nodes_per_round", "n_rounds", "round", total="verified_nodes"),
            *entries_per("prompt_n_tokens", "n_prompts", "prompt"),
            *entries_per("prompt_latency_ms", "n_prompts", "prompt"),
        ),
        groups=(
            GroupRule(
                _REPORT,
                "schedule",
                "2^D schedules per report (D = the schedule's length)",
                (pl.len() == pow2(length.first())) & (length.n_unique() == 1),
            ),
            *constant_per(_REPORT, ("pair_id", "dataset_id", "mode", "profile_id", "n_prompts")),
        ),
    )


CONTINUATIONS_VERSION = "v1"

CONTINUATIONS = TableSpec(
    "continuations",
    CONTINUATIONS_VERSION,
    (
        *_KEYS,
        ("prompt_id", pa.int32()),
        ("prompt_sha256", pa.string()),  # of the prompt's token ids (collectors.collect.report.prompt_digest)
        ("tokens", pa.list_(pa.int32())),  # g: greedy, past EOS, max_new_tokens plus the replay's margin
        ("stop", pa.int32()),  # tokens of g decoding emits: through its first EOS, at most max_new_tokens
    ),
    Contract(
        key=("report_id", "prompt_id"),
        rules=(
            *non_negative("prompt_id"),
            *positive("stop"),
            Rule("stop", "<= len(tokens)", pl.col("stop") <= pl.col("tokens").list.len()),
        ),
    ),
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
    _trajectory_contract(),
)


def schedule_step_rules(depth: int) -> tuple[Rule, ...]:
    """Rows keyed by (schedule_id, step): the id is in 0..2^D-1, k in 1..D, and the prefix (steps
    before k), the action (step k) and the suffix (steps after k) are the id's bits."""
    sid, step = pl.col("schedule_id").cast(pl.Int64), pl.col("step").cast(pl.Int64)
    return (
        in_range("schedule_id", 0, 2**depth - 1),
        in_range("step", 1, depth),
        bits_text("prefix", step - 1),
        bits_text("suffix", depth - step),
        Rule("prefix", "schedule_id's bits before step", bits_value("prefix", depth) == sid % pow2(step - 1)),
        Rule(
            "is_invoke",
            "schedule_id's bit at step",
            pl.col("is_invoke") == ((sid // pow2(step - 1)) % 2 == 1),
        ),
        Rule("suffix", "schedule_id's bits after step", bits_value("suffix", depth) == sid // pow2(step)),
    )


def _step_frac(depth: int) -> pl.Expr:
    # k / D as Python computes it: polars divides by a constant as a product with its reciprocal
    exact = {k: k / depth for k in range(1, depth + 1)}
    return pl.col("step").cast(pl.Int64).replace_strict(exact, default=None, return_dtype=pl.Float64)


def state_feature_rules(depth: int) -> tuple[Rule, ...]:
    """Ranges of z's features (decoder/core/state.py) that hold for one action row and for any mean of
    rows of one state: history is a function of (step, prefix), so it is exact, not a range (an
    action row's k / D is already a mean over rounds: it may round, by 1e-12 at most)."""
    prefix = pl.col("prefix")
    called = tuple(
        Rule(
            f"called_step_{j}",
            "1.0 if the prefix calls mid at step j, else 0.0",
            pl.col(f"called_step_{j}") == (prefix.str.slice(j - 1, 1) == "1").cast(pl.Float64),
        )
        for j in range(1, depth)
    )
    return (
        *non_negative("log_prompt_tokens", "target_ms", "mid_ms", "log_mid_lag", "frontier_size"),
        *non_negative("preview_collapse_debt"),
        *(in_range(n, 0, 1) for n in ("ngram_match_frac", "frontier_leaf_ratio", "preview_overlap_ratio")),
        in_range("preview_history_share", 0, 1),
        Rule("step_frac", "step / D", (pl.col("step_frac") - _step_frac(depth)).abs() <= 1e-12),
        *called,
        Rule(
            "log_mid_lag",
            "0 after a mid call (it caught the lag up)",
            ~prefix.str.contains("1") | (pl.col("log_mid_lag") == 0),
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
        Contract(
            key=("report_id", "schedule_id", "step"),
            rules=(*schedule_step_rules(depth), *state_feature_rules(depth), *_OUTCOME_RULES),
            groups=(
                rows_per(_REPORT, 2**depth * depth, f"2^D x D = {2**depth * depth}"),
                *constant_per(("report_id", "schedule_id"), [n for n, _ in _OUTCOME]),
                *constant_per(_REPORT, ("pair_id", "dataset_id", *CONTEXT_NAMES)),
            ),
        ),
    )


def rounds_spec(depth: int) -> TableSpec:
    """Replay's round-level table: every schedule's outcome from every visited round start.

    ``prompt_tokens``: the prompt's own length; ``mid_lag``: committed tokens the mid drafter's
    cache lacks at this start (collectors.collect.trajectory.arrival_lag); ``round_latency_ms`` prices the
    round as execute mode would with that lag (its first mid call also catches up ``mid_lag``)
    and the ``prompt_blocks`` of the prompt's top-m rows it reads that the arrival the lag comes
    from had not read (collectors.collect.trajectory.arrival), one scheduler decision per step included;
    ``catch_up_ms``: the part of ``round_latency_ms`` that catching up the lag costs (0 for a round
    with no mid call or no lag);
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
            ("catch_up_ms", pa.float64()),
            ("decision_ms", pa.float64()),
            ("decision_cold_ms", pa.float64()),
            ("throughput_tok_per_s", pa.float64()),
            ("is_round_best", pa.bool_()),
            ("signals", pa.list_(pa.float32())),
        ),
        _rounds_contract(depth),
    )


def _rounds_contract(depth: int) -> Contract:
    start = ("report_id", "prompt_id", "start_position")
    calls = pl.col("mid_call_tokens").list.len()
    return Contract(
        key=(*start, "schedule_id"),
        rules=(
            in_range("schedule_id", 0, 2**depth - 1),
            *non_negative("prompt_id", "prompt_tokens", "start_position", "mid_lag", "accepted"),
            *non_negative(
                "verified_nodes", "prompt_blocks", "decision_ms", "decision_cold_ms", "catch_up_ms"
            ),
            *positive("round_latency_ms"),
            *elements_non_negative("mid_call_tokens"),
            Rule("catch_up_ms", "below round_latency_ms", pl.col("catch_up_ms") < pl.col("round_latency_ms")),
            Rule(
                "catch_up_ms",
                "0 without a lag or a mid call",
                (pl.col("catch_up_ms") == 0) | ((pl.col("mid_lag") > 0) & (calls > 0)),
            ),
            Rule(
                "mid_call_tokens",
                "one entry per mid call of the schedule",
                calls == popcount("schedule_id", depth),
            ),
            Rule("n_small_steps", "D minus the mid calls", pl.col("n_small_steps") == depth - calls),
            Rule(
                "throughput_tok_per_s",
                "1e3 x (accepted + 1) / round_latency_ms",
                pl.col("throughput_tok_per_s")
                == 1e3 * (pl.col("accepted").cast(pl.Float64) + 1) / pl.col("round_latency_ms"),
            ),
            Rule(
                "signals",
                f"D x {len(RECORDED_NAMES)} values",
                pl.col("signals").list.len() == depth * len(RECORDED_NAMES),
            ),
        ),
        groups=(
            rows_per(start, 2**depth, f"2^D = {2**depth}"),
            GroupRule(
                start,
                "is_round_best",
                "exactly one best schedule per round start",
                pl.col("is_round_best").sum() == 1,
            ),
            *constant_per(start, ("prompt_tokens", "mid_lag")),
            *constant_per(_REPORT, ("pair_id", "dataset_id", "decision_ms", "decision_cold_ms")),
        ),
    )
