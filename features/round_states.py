"""Round-level states: the states the decoder sees, one per (round start, step k, prefix a_<k).

The canonical states (features/canonical.py) average each tree signal over a trajectory's rounds
and prompts; online the scheduler sees one round's raw values. This module builds the second
training set from the collectors' round table (every schedule's outcome from every round-table
start, with the tree signals before each step):

- z in decoder.core.state.state_feature_names(D) order (all 10 signals; callers pick columns):
  context = log1p(the prompt's own length) and the report's profiled timings (target ms, mid ms,
  their log ratio: what the runtime context and the canonical states hold); history from the bits
  of the prefix, the start's mid lag (0 once the prefix has called the mid drafter, as online)
  and the round's own n-gram lookahead before step k; the round's own tree signals before step k
  (signals and lookahead equal for every schedule sharing the prefix).
- two margins, a schedule's round value being (accepted + 1) / its priced round ms (both in the
  round table; the ms less the lag's catch-up where the report's best fixed schedule calls the mid
  drafter, :func:`_with_values`), each also relative (/ the better branch's value):
  - ``margin_suffix_tok_per_s`` / ``margin_suffix_relative``, the training target
    (pipeline/distill.py): the round's value of prefix + '1' + the report's best suffix after it
    minus that of prefix + '0' + the report's best suffix after it, a suffix's merit being its
    schedule's ms per token summed over the report's starts (what the walks price): this round's
    outcome of invoking (skipping) now and then following the best fixed continuation, the
    margin of one step of policy improvement over the report's best fixed schedule;
  - ``margin_tok_per_s`` / ``margin_relative``, kept for comparison: exhaustive suffix search
    inside the round, the best value of the round over prefix + '1' + any suffix minus the best
    over prefix + '0' + any suffix. Each branch's best of 2^(D-k) noisy values, chosen on this
    round's own outcomes: students trained on it called the mid drafter at 20-26% of zoo-chat-l's
    steps, where they walked 17-21% behind a fixed 10101 (60%) (same data and folds: the round
    walk of the exported training states 73.1% of the round oracle with these targets, 75.5% with
    the suffix ones).
- the walks (:func:`round_walk_pct` and its per-report form, :func:`priced_walk_pct`,
  :func:`backoff_walk_pct`) score a policy per report as the round oracle's ms per token summed
  over the report's starts / the policy's (the oracle: each start's best schedule), in %; mean
  over reports.

Why ms per token: the table's starts cover a report's text about evenly (the union of every
schedule's visited starts), and a decoder that takes schedule s at a position spends about
ms_s / tokens_s per token of the text there, so a policy's time for the text is about the sum over
the starts of its ms per token. Per fixed schedule this estimate is within 2-4% (one sd over a
report's 32 schedules) of the throughput of the schedule's own trajectory. Tokens and ms summed
over the starts are not (3-16%): the starts weigh easy stretches of text as much as hard ones,
where a decoder spends more rounds (All-Small gets 6.0 tokens per round at zoo-l alpaca's table
starts, 2.8 along its own trajectory); nor is the mean of per-start ratios, which the walks used
before. The best choice at one start is still the highest tokens/s, the margin's sign. Weighting
the training margins by the ms per token a choice saves, the same logic, was tried: priced on 22
held-back cells that student was behind (+9.9% over the better endpoint against +10.7%; 1-4
points behind on zoo-m and zoo-chat-m), so the margins stay relative to the better branch.

Grouping, exploding and joins are polars; sorted by (report, prompt, start, step, prefix).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl
import pyarrow as pa

from decoder.core.policies import RoundBackoff, schedule_bits
from decoder.core.state import (
    CONTEXT_NAMES,
    LOOKAHEAD_NAME,
    RECORDED_NAMES,
    history_features,
    history_names,
    state_feature_names,
)
from features.collect_schemas import rounds_spec
from features.tables import SchemaError

KEY = ("report_id", "prompt_id", "start_position", "step", "prefix")
START = list(KEY[:3])  # one round-table start
TIMINGS = CONTEXT_NAMES[1:]  # target_ms, mid_ms, log_target_mid_ratio: per report
OUTCOMES = (
    "invoke_tok_per_s",
    "skip_tok_per_s",
    "margin_tok_per_s",
    "margin_relative",
    "margin_suffix_tok_per_s",
    "margin_suffix_relative",
)


def round_state_names(depth: int) -> tuple[str, ...]:
    """The table's columns: keys, the fold, z (all signals), the round maxima's branch values and
    both margins."""
    return ("pair_id", "dataset_id", "fold_id", *KEY, *state_feature_names(depth), *OUTCOMES)


def schedule_strings(depth: int) -> list[str]:
    """Every schedule's bits as a string (step 1 first), in schedule_id order."""
    return _schedules(depth)["schedule"].to_list()


def _schedules(depth: int) -> pl.DataFrame:
    bits = ["".join("1" if b else "0" for b in schedule_bits(s, depth)) for s in range(2**depth)]
    return pl.DataFrame(
        {"schedule_id": list(range(2**depth)), "schedule": bits},
        schema={"schedule_id": pl.Int16, "schedule": pl.String},
    )


def report_context(actions: pa.Table | pl.DataFrame, folds: pa.Table | pl.DataFrame) -> pl.DataFrame:
    """Per report: its outer fold (``folds``: report_id, fold_id; e.g. the canonical states) and the
    profiled timings exactly as the runtime context gives them (read off the collectors' action
    rows, where they are one value per report; more than one is an error naming the report)."""
    acts = (
        actions
        if isinstance(actions, pl.DataFrame)
        else pl.from_arrow(actions.select(["report_id", *TIMINGS]))
    )
    fold = folds if isinstance(folds, pl.DataFrame) else pl.from_arrow(folds.select(["report_id", "fold_id"]))
    per = acts.group_by("report_id").agg(
        *(pl.col(c).n_unique().alias(f"_n_{c}") for c in TIMINGS), *(pl.col(c).first() for c in TIMINGS)
    )
    fold = fold.group_by("report_id").agg(
        pl.col("fold_id").n_unique().alias("_n_fold_id"), pl.col("fold_id").first()
    )
    per = per.join(fold, on="report_id", how="left")
    for c in ("fold_id", *TIMINGS):
        bad = per.filter(pl.col(f"_n_{c}") != 1)["report_id"].to_list()
        if bad:
            raise ValueError(f"round states: {c} is not one value in report(s) {bad[:3]}")
    return per.select("report_id", pl.col("fold_id").cast(pl.Int64), *TIMINGS)


def round_states(rounds: pa.Table, context: pl.DataFrame, depth: int) -> pl.DataFrame:
    """The round-level states table (columns: :func:`round_state_names`) from the round table and
    :func:`report_context`; every start must hold all 2^D schedules."""
    spec = rounds_spec(depth)
    if rounds.schema.names != spec.names:
        raise SchemaError(f"rounds table does not match {spec.tag}: columns {rounds.schema.names}")
    frame = pl.from_arrow(rounds.select([n for n in spec.names if n not in ("mid_call_tokens",)]))
    start = ["report_id", "prompt_id", "start_position"]
    counts = frame.group_by(start).agg(pl.col("schedule_id").n_unique().alias("n"))
    short = counts.filter(pl.col("n") != 2**depth)
    if short.height:
        raise ValueError(f"rounds: start {short.row(0)[:3]} has {short['n'][0]} schedules, not {2**depth}")
    missing = frame.select("report_id").unique().join(context, on="report_id", how="anti")
    if missing.height:
        raise ValueError(f"rounds: report(s) {missing['report_id'].to_list()[:3]} have no canonical states")
    n_sig = len(RECORDED_NAMES)  # per step: the candidate signals, then the lookahead
    frame = frame.join(_schedules(depth), on="schedule_id")
    costs = _schedule_costs(frame)
    valued = _with_values(frame, costs)
    steps = (
        valued.with_columns(step=pl.lit(list(range(1, depth + 1)), pl.List(pl.Int64)))
        .explode("step")
        .with_columns(
            prefix=pl.col("schedule").str.slice(0, pl.col("step") - 1),
            is_invoke=pl.col("schedule").str.slice(pl.col("step") - 1, 1) == "1",
            sig=pl.col("signals").list.slice((pl.col("step") - 1) * n_sig, n_sig),
        )
    )
    by = [*start, "step", "prefix"]
    states = steps.group_by(by).agg(
        pl.col("pair_id", "dataset_id", "prompt_tokens", "mid_lag").first(),
        pl.col("sig").sort_by("schedule_id").first(),
        pl.col("value").filter(pl.col("is_invoke")).max().alias("invoke_tok_per_s"),
        pl.col("value").filter(~pl.col("is_invoke")).max().alias("skip_tok_per_s"),
    )
    margin = pl.col("invoke_tok_per_s") - pl.col("skip_tok_per_s")
    suffix = pl.col("suffix_invoke") - pl.col("suffix_skip")
    out = (
        _with_suffix_values(states, valued, costs, depth)
        .join(context, on="report_id", how="left")
        .join(_history(states, depth), on=["step", "prefix", "mid_lag"], how="left")
        .join(_log_prompt(states), on="prompt_tokens", how="left")
        .with_columns(
            *(pl.col("sig").list.get(i).cast(pl.Float64).alias(n) for i, n in enumerate(RECORDED_NAMES)),
            margin.alias("margin_tok_per_s"),
            (margin / pl.max_horizontal("invoke_tok_per_s", "skip_tok_per_s")).alias("margin_relative"),
            suffix.alias("margin_suffix_tok_per_s"),
            (suffix / pl.max_horizontal("suffix_invoke", "suffix_skip")).alias("margin_suffix_relative"),
        )
        .sort(list(KEY))
    )
    return out.select(round_state_names(depth))


def _schedule_costs(frame: pl.DataFrame) -> pl.DataFrame:
    """Per (report, schedule) its ms per token summed over the report's starts (``cost``): which
    fixed schedule serves the report best."""
    per_token = pl.col("round_latency_ms") / (pl.col("accepted").cast(pl.Float64) + 1)
    return frame.group_by("report_id", "schedule").agg(per_token.sum().alias("cost"))


def _with_values(frame: pl.DataFrame, cost: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (round-table rows with their ``schedule`` strings) plus ``value``, the round's value
    for the margins: 1e3 (accepted + 1) / its priced ms, where in a report whose best fixed schedule
    calls the mid drafter the ms leave out the lag's catch-up (``catch_up_ms``).

    Why: a margin compares this round's branches, each followed by the report's best fixed
    continuation. Where that continuation calls the mid drafter, the lag is caught up whichever
    branch this round takes (now, or in the next round's first call, a few tokens more), so charging
    it to the branch that calls now measures when the catch-up is paid, not whether. Charged, a
    round start with a long lag (every prompt's first: the whole prompt) says "skip"; a student that
    skips there finds the lag longer at the next start, which says "skip" again, and online it never
    calls the mid drafter (the real pair's first student decided as All-Small on every calibration
    prompt, while the fixed 10000 priced 1.29x faster). Where the best fixed schedule is All-Small
    the catch-up is paid only by calling, and stays charged. The walks price the table as it is."""
    ms, accepted = pl.col("round_latency_ms"), pl.col("accepted").cast(pl.Float64) + 1
    calls = (
        cost.sort("cost", "schedule")
        .group_by("report_id", maintain_order=True)
        .agg(pl.col("schedule").first().str.contains("1").alias("best_calls_mid"))
    )
    paid = ms - pl.when(pl.col("best_calls_mid")).then(pl.col("catch_up_ms")).otherwise(0.0)
    return frame.join(calls, on="report_id").with_columns((1e3 * accepted / paid).alias("value"))


def _with_suffix_values(
    states: pl.DataFrame, values: pl.DataFrame, cost: pl.DataFrame, depth: int
) -> pl.DataFrame:
    """``states`` plus ``suffix_invoke`` / ``suffix_skip``: the start's round value of prefix + '1'
    (+ '0') + the report's best suffix after it. ``values``: per (start, schedule) the round value,
    priced ms and accepted tokens; ``cost``: :func:`_schedule_costs`. A suffix's merit: its
    schedule's cost (ties: the smaller schedule string, so fewer mid calls)."""
    best = pl.concat(
        cost.with_columns(head=pl.col("schedule").str.slice(0, k))
        .sort("cost", "schedule")
        .group_by("report_id", "head", maintain_order=True)
        .agg(pl.col("schedule").first().alias("best"))
        for k in range(1, depth + 1)
    )
    by_start = values.select("report_id", "prompt_id", "start_position", "schedule", "value")
    out = states
    for action, name in (("1", "suffix_invoke"), ("0", "suffix_skip")):
        out = (
            out.with_columns(head=pl.col("prefix") + action)
            .join(best, on=["report_id", "head"], how="left")
            .join(
                by_start.rename({"schedule": "best", "value": name}),
                on=["report_id", "prompt_id", "start_position", "best"],
                how="left",
            )
            .drop("head", "best")
        )
    if out["suffix_invoke"].null_count() or out["suffix_skip"].null_count():
        raise ValueError("rounds: a start lacks the report's best continuation of one of its prefixes")
    return out


def _history(states: pl.DataFrame, depth: int) -> pl.DataFrame:
    """History features per distinct (step, prefix, lag), by the decoder's own history_features
    (bit-identical to what the runtime computes), all but the lookahead: that one passes through
    history_features unchanged, and :func:`round_states` takes it from the round's own signals."""
    keys = states.select("step", "prefix", "mid_lag").unique().sort("step", "prefix", "mid_lag")
    rows = [
        history_features(k, depth, tuple(c == "1" for c in prefix), lag, 0.0)
        for k, prefix, lag in keys.iter_rows()
    ]
    return keys.with_columns(
        pl.Series(n, [r[i] for r in rows], dtype=pl.Float64)
        for i, n in enumerate(history_names(depth))
        if n != LOOKAHEAD_NAME
    )


def _log_prompt(states: pl.DataFrame) -> pl.DataFrame:
    """log1p(prompt tokens) per distinct length, as decoder.core.state.context_features computes it."""
    lengths = states["prompt_tokens"].unique().sort()
    return pl.DataFrame(
        {
            "prompt_tokens": lengths,
            CONTEXT_NAMES[0]: pl.Series([math.log1p(n) for n in lengths], dtype=pl.Float64),
        }
    )


def feature_matrix(frame: pl.DataFrame, names: Sequence[str]):
    """(n, len(names)) float64 NumPy matrix of the given feature columns."""
    return frame.select(list(names)).to_numpy().astype("float64")


def round_walk_pct(frame: pl.DataFrame, outcomes: pl.DataFrame, depth: int) -> float:
    """Walk each round-table start's states from the empty prefix by the boolean column
    ``is_invoke``; per report, the round oracle's ms per token summed over its starts / the
    reached schedules' (both priced as in the round table, a decision at every step), in %; mean
    over reports. ``outcomes``: :func:`round_outcomes`."""
    return float(round_walk_pct_by_report(frame, outcomes, depth)["pct"].mean())


def round_walk_pct_by_report(frame: pl.DataFrame, outcomes: pl.DataFrame, depth: int) -> pl.DataFrame:
    """:func:`round_walk_pct` per report (columns report_id, pct; sorted by report)."""
    states = frame.select(
        *START, "step", "prefix", score=pl.col("is_invoke").cast(pl.Float64), threshold=pl.lit(0.5)
    )
    return _pct_by_report(outcomes, _walk(states, depth, None), depth, decided=True)


def round_outcomes(rounds: pa.Table) -> pl.DataFrame:
    """Per (round start, schedule): tokens emitted, priced ms (one decision per step included) and
    the cost of one decision and its extra once per round that decides: what :func:`priced_walk_pct`
    reprices a walk with."""
    cols = ["report_id", "prompt_id", "start_position", "schedule_id", "accepted", "round_latency_ms"]
    return pl.from_arrow(rounds.select([*cols, "decision_ms", "decision_cold_ms"]))


def _walk(
    states: pl.DataFrame, depth: int, skip_rest_below: float | None, max_target_ms: float | None = None
) -> pl.DataFrame:
    """Per round start: the schedule the walk by score > threshold reaches (``schedule``, step 1
    first), the decisions it took (``decisions``) and how far below its threshold the highest
    decided score lay (``slack``, negative once a decision invoked); see :func:`priced_walk_pct`."""
    gated = ["target_ms"] if skip_rest_below is not None and max_target_ms is not None else []
    lookup = states.select(*START, "step", "prefix", "score", "threshold", *gated)
    walk = lookup.filter(pl.col("step") == 1).select(
        *START,
        prefix=pl.lit(""),
        skipping=pl.lit(False),
        decisions=pl.lit(0, pl.Int64),
        slack=pl.lit(float("inf")),
    )
    for k in range(1, depth + 1):
        walk = walk.join(lookup.filter(pl.col("step") == k).drop("step"), on=[*START, "prefix"], how="left")
        if walk["score"].null_count():
            raise ValueError(f"round states: a walk reaches a step-{k} prefix the table lacks")
        deciding = ~pl.col("skipping")
        invoke = deciding & (pl.col("score") > pl.col("threshold"))
        stop = (
            deciding & ~invoke & (pl.col("score") < pl.col("threshold") - skip_rest_below)
            if skip_rest_below is not None
            else pl.lit(False)
        )
        if gated:
            stop = stop & (pl.col("target_ms") <= max_target_ms)
        walk = walk.with_columns(
            prefix=pl.col("prefix") + pl.when(invoke).then(pl.lit("1")).otherwise(pl.lit("0")),
            decisions=pl.col("decisions") + deciding.cast(pl.Int64),
            skipping=pl.col("skipping") | stop,
            slack=pl.when(deciding)
            .then(pl.min_horizontal("slack", pl.col("threshold") - pl.col("score")))
            .otherwise(pl.col("slack")),
        ).drop("score", "threshold", *gated)
    return walk.select(*START, schedule="prefix", decisions="decisions", slack="slack")


def _pct_by_report(
    outcomes: pl.DataFrame, walk: pl.DataFrame, depth: int, decided: bool = False
) -> pl.DataFrame:
    """Per report (columns report_id, pct; sorted by report), the round oracle's ms per token (each
    start's best fixed schedule) summed over its starts / that of the schedules ``walk`` reaches,
    in % (see the module docstring). Prices: ``decided`` False: the oracle's schedules as fixed
    ones, with no decisions, and each reached one with the walk's own ``decisions``; True: the
    round table's prices (one decision per step) on both sides."""
    tokens = pl.col("accepted").cast(pl.Float64) + 1
    ms = pl.col("round_latency_ms")
    deciding = pl.col("decision_cold_ms")  # once per round that decides
    base = ms if decided else ms - depth * pl.col("decision_ms") - deciding
    best = outcomes.group_by(START).agg((base / tokens).min().alias("best"))
    reached = (
        walk.join(_schedules(depth), on="schedule", how="left")
        .join(outcomes, on=[*START, "schedule_id"], how="left")
        .join(best, on=START, how="left")
    )
    if reached["accepted"].null_count():
        raise ValueError("round states: a walk reaches a schedule the round table lacks")
    decided_cold = pl.when(pl.col("decisions") > 0).then(deciding).otherwise(0.0)
    paid = base if decided else base + pl.col("decisions") * pl.col("decision_ms") + decided_cold
    per_report = reached.group_by("report_id").agg(pct=100 * pl.col("best").sum() / (paid / tokens).sum())
    return per_report.sort("report_id")


def priced_walk_pct(
    outcomes: pl.DataFrame,
    states: pl.DataFrame,
    depth: int,
    skip_rest_below: float | None,
    max_target_ms: float | None = None,
) -> float:
    """Walk each round start's states by ``score`` > ``threshold`` (columns of ``states``, with
    the start keys, step and prefix) and price the reached schedule with the decisions the walk
    took: a score below threshold - ``skip_rest_below`` skips every later step of the round
    without deciding (None: never), only in reports whose ``target_ms`` (a column of ``states``
    then) is at most ``max_target_ms`` when that is given (the student's
    ``skip_rest_max_target_ms``). Per report, the round oracle's ms per token summed over its
    starts (fixed schedules, priced with no decisions at all: a fixed schedule decides nothing) /
    the reached schedules' (each round's ms less the decisions not taken), in %; mean over
    reports."""
    return float(
        priced_walk_pct_by_report(outcomes, states, depth, skip_rest_below, max_target_ms)["pct"].mean()
    )


def priced_walk_pct_by_report(
    outcomes: pl.DataFrame,
    states: pl.DataFrame,
    depth: int,
    skip_rest_below: float | None,
    max_target_ms: float | None = None,
) -> pl.DataFrame:
    """:func:`priced_walk_pct` per report (columns report_id, pct; sorted by report)."""
    return _pct_by_report(outcomes, _walk(states, depth, skip_rest_below, max_target_ms), depth)


def backoff_walk_pct(
    outcomes: pl.DataFrame,
    states: pl.DataFrame,
    depth: int,
    skip_rest_below: float | None,
    skip_rounds_max: int,
    skip_rounds_margin: float = 0.0,
    max_target_ms: float | None = None,
) -> float:
    """:func:`priced_walk_pct` with the student's cross-round backoff (decoder.core.policies.RoundBackoff,
    cap ``skip_rounds_max`` = c, idle margin ``skip_rounds_margin`` = h) carried from start to
    start: within each (report_id, prompt_id) the starts are taken in order of start_position; a
    start inside a skip-run plays 00000 with zero decisions, any other start walks as
    :func:`priced_walk_pct` does (gate ``skip_rest_below`` up to ``max_target_ms``) and is idle
    when none of its decided scores exceeded threshold - h (h = 0: it reached 00000). c = 0 is
    :func:`priced_walk_pct`.

    What it approximates: the round table holds every ``collect.round_table_stride``-th round start
    visited by any schedule's trajectory (in position order), not the rounds of the student's own
    trajectory. The walk takes a prompt's table starts, in order, as if they were consecutive
    rounds of one generation, and counts skip-runs in table starts, unscaled: a skip-run of n
    starts here covers the tokens between n table starts, which is not the span of n rounds of the
    student's own trajectory (each round emits its accepted + 1 tokens). What it measures is the
    trade c makes per skipped round (the decisions saved against the mid calls the skipped rounds
    would have made), in the price units of :func:`priced_walk_pct`; the decoder's skip-runs are
    counted in its own rounds."""
    per = backoff_walk_pct_by_report(
        outcomes, states, depth, skip_rest_below, skip_rounds_max, skip_rounds_margin, max_target_ms
    )
    return float(per["pct"].mean())


def backoff_walk_pct_by_report(
    outcomes: pl.DataFrame,
    states: pl.DataFrame,
    depth: int,
    skip_rest_below: float | None,
    skip_rounds_max: int,
    skip_rounds_margin: float = 0.0,
    max_target_ms: float | None = None,
) -> pl.DataFrame:
    """:func:`backoff_walk_pct` per report (columns report_id, pct; sorted by report)."""
    walk = _backoff_walk(states, depth, skip_rest_below, skip_rounds_max, skip_rounds_margin, max_target_ms)
    return _pct_by_report(outcomes, walk, depth)


def _backoff_walk(
    states: pl.DataFrame,
    depth: int,
    skip_rest_below: float | None,
    skip_rounds_max: int,
    skip_rounds_margin: float,
    max_target_ms: float | None,
) -> pl.DataFrame:
    """:func:`_walk` with the cross-round backoff carried from start to start (see
    :func:`backoff_walk_pct`)."""
    walk = _walk(states, depth, skip_rest_below, max_target_ms).sort(START)
    backoff, idle = RoundBackoff(skip_rounds_max), "0" * depth
    schedules, decisions, prompt = [], [], None
    for report, prompt_id, schedule, n, slack in walk.select(
        "report_id", "prompt_id", "schedule", "decisions", "slack"
    ).iter_rows():
        if (report, prompt_id) != prompt:
            prompt = (report, prompt_id)
            backoff.reset()
        if backoff.start_round():
            schedules.append(idle)
            decisions.append(0)
            continue
        if slack < skip_rounds_margin:
            backoff.engaged()
        schedules.append(schedule)
        decisions.append(n)
    return walk.with_columns(
        schedule=pl.Series(schedules, dtype=pl.String), decisions=pl.Series(decisions, dtype=pl.Int64)
    )


def fixed_schedule_pct(outcomes: pl.DataFrame, depth: int, schedule_id: int) -> float:
    """One fixed schedule in every round, priced without decisions, as % of the round oracle (the
    :func:`priced_walk_pct` baseline); mean over reports."""
    return float(fixed_schedule_pct_by_report(outcomes, depth, schedule_id)["pct"].mean())


def fixed_schedule_pct_by_report(outcomes: pl.DataFrame, depth: int, schedule_id: int) -> pl.DataFrame:
    """:func:`fixed_schedule_pct` per report (columns report_id, pct; sorted by report)."""
    every = fixed_schedules_pct_by_report(outcomes, depth)
    return every.filter(pl.col("schedule_id") == schedule_id).select("report_id", "pct")


def fixed_schedules_pct_by_report(outcomes: pl.DataFrame, depth: int) -> pl.DataFrame:
    """Every one of the 2^D fixed schedules per report in one group-by (columns report_id,
    schedule_id, schedule, pct; sorted by report, then schedule_id): the round oracle's ms per
    token summed over the report's starts / the schedule's, both priced without decisions (what
    :func:`_pct_by_report` gives a walk that plays the schedule at every start)."""
    tokens = pl.col("accepted").cast(pl.Float64) + 1
    base = pl.col("round_latency_ms") - depth * pl.col("decision_ms") - pl.col("decision_cold_ms")
    per_token = outcomes.with_columns(per_token=base / tokens)
    counts = per_token.group_by(START).agg(pl.len().alias("n"), pl.col("per_token").min().alias("best"))
    short = counts.filter(pl.col("n") != 2**depth)
    if short.height:
        raise ValueError(f"round outcomes: start {short.row(0)[:3]} lacks some of the {2**depth} schedules")
    return (
        per_token.join(counts.drop("n"), on=START)
        .group_by("report_id", "schedule_id")
        .agg(pct=100 * pl.col("best").sum() / pl.col("per_token").sum())
        .join(_schedules(depth), on="schedule_id", how="left")
        .select("report_id", "schedule_id", "schedule", "pct")
        .sort("report_id", "schedule_id")
    )
