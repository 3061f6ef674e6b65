"""The collect stage's closing table: per report, the best fixed schedule against the endpoints,
how stable that choice is under a bootstrap over the report's prompts, what a schedule chosen on
half of the prompts is worth on the other half (how much of "the best schedule in hindsight" is the
prompts' noise: a ceiling for any choice made without seeing them), and the per-round hindsight
oracle from the round-level table (an upper bound for any per-step scheduler). Pure functions over
the merged tables; the grouping is polars."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
from tabulate import tabulate

BOOTSTRAP_RESAMPLES = 1000

_SID, _TPS, _A = pl.col("schedule_id"), pl.col("throughput_tok_per_s"), pl.col("mean_accepted_length")
_SMALL, _MID = _SID == 0, _SID.eq(_SID.max())  # All-Small is schedule 0, All-Mid the largest id
# The fastest schedule; ties go to the smallest schedule id.
_FASTEST = {"by": [_TPS, _SID], "descending": [True, False]}


def per_report(trajectories: pa.Table) -> pl.DataFrame:
    """One row per report, in first-seen order: both endpoints, the best schedule and its gain."""
    frame = pl.from_arrow(
        trajectories.select(
            ["report_id", "schedule_id", "schedule", "throughput_tok_per_s", "mean_accepted_length"]
        )
    )
    return (
        frame.group_by("report_id", maintain_order=True)
        .agg(
            small_tps=_TPS.filter(_SMALL).first(),
            small_a=_A.filter(_SMALL).first(),
            mid_tps=_TPS.filter(_MID).first(),
            mid_a=_A.filter(_MID).first(),
            best_schedule=pl.col("schedule").sort_by(**_FASTEST).first(),
            best_tps=_TPS.sort_by(**_FASTEST).first(),
            best_a=_A.sort_by(**_FASTEST).first(),
        )
        .with_columns(gain=pl.col("best_tps") / pl.max_horizontal("small_tps", "mid_tps"))
    )


def round_oracle(rounds: pa.Table) -> dict[str, float]:
    """Mean over round starts of best tokens/s / better endpoint tokens/s, per report."""
    frame = pl.from_arrow(
        rounds.select(["report_id", "prompt_id", "start_position", "schedule_id", "throughput_tok_per_s"])
    )
    better_end = pl.max_horizontal(_TPS.filter(_SMALL).first(), _TPS.filter(_MID).first())
    ratios = (
        frame.group_by("report_id", "prompt_id", "start_position")
        .agg(ratio=_TPS.max() / better_end)
        .group_by("report_id")
        .agg(pl.col("ratio").mean())
    )
    return dict(ratios.iter_rows())


def best_stability(
    trajectories: pa.Table, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, float]:
    """Per report, the share of bootstrap resamples of its prompts (drawn with replacement) whose
    fastest schedule (tokens over priced time, summed over the resampled prompts; ties to the
    smallest id) is the full sample's fastest. 1.0: every resample keeps the same best schedule."""
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    for report_id, tokens, ms in _per_prompt(trajectories):  # [schedules, prompts]
        n = tokens.shape[1]
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)
        best = np.argmax((weights @ tokens.T) / (weights @ ms.T), axis=1)  # first max: smallest id
        full = int(np.argmax(tokens.sum(axis=1) / ms.sum(axis=1)))
        out[report_id] = float(np.mean(best == full))
    return out


def _per_prompt(trajectories: pa.Table) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(report id, tokens [schedules, prompts], priced ms [schedules, prompts]) per report, schedules
    in id order."""
    frame = pl.from_arrow(
        trajectories.select(["report_id", "schedule_id", "prompt_n_tokens", "prompt_latency_ms"])
    ).sort("report_id", "schedule_id", maintain_order=True)
    for (report_id,), group in frame.group_by("report_id", maintain_order=True):
        tokens = np.array(group["prompt_n_tokens"].to_list(), dtype=np.float64)
        yield str(report_id), tokens, np.array(group["prompt_latency_ms"].to_list(), dtype=np.float64)


def half_split(trajectories: pa.Table) -> dict[str, float]:
    """Per report with at least 2 prompts, the mean over every split of its prompts into a chosen half
    (n // 2 prompts, every such subset) and the rest of: the rest's tokens/s (tokens over priced time,
    summed over those prompts) under the schedule fastest on the chosen half (ties to the smallest
    id), over the rest's own fastest. 1.0: a choice on half the prompts loses nothing on the others;
    below it, the share of "the best schedule in hindsight" that no choice made without seeing the
    prompts can reach."""
    out: dict[str, float] = {}
    for report_id, tokens, ms in _per_prompt(trajectories):
        n = tokens.shape[1]
        if n < 2:
            continue
        ratios = []
        for chosen in itertools.combinations(range(n), n // 2):
            rest = [i for i in range(n) if i not in chosen]
            on_rest = tokens[:, rest].sum(axis=1) / ms[:, rest].sum(axis=1)
            pick = int(np.argmax(tokens[:, chosen].sum(axis=1) / ms[:, chosen].sum(axis=1)))
            ratios.append(on_rest[pick] / on_rest.max())
        out[report_id] = float(np.mean(ratios))
    return out


def summarise(trajectories: pa.Table, rounds: pa.Table, seed: int = 0) -> tuple[str, dict]:
    """A markdown table and a metrics dict; ``seed`` draws the bootstrap over prompts."""
    reports = per_report(trajectories)
    oracle = round_oracle(rounds)
    stability = best_stability(trajectories, seed)
    halves = half_split(trajectories)
    head = ["report", "All-Small tok/s (A)", "All-Mid tok/s (A)", "best schedule", "best tok/s (A)",
            "best / better end", "best kept", "half split", "round oracle"]  # fmt: skip
    body = []
    for r in reports.iter_rows(named=True):
        orc = f"{oracle[r['report_id']]:.2f}x" if r["report_id"] in oracle else "-"
        half = f"{halves[r['report_id']]:.1%}" if r["report_id"] in halves else "-"
        body.append([r["report_id"], _fmt(r, "small"), _fmt(r, "mid"), r["best_schedule"], _fmt(r, "best"),
                     f"{r['gain']:.3f}x", f"{stability[r['report_id']]:.0%}", half, orc])  # fmt: skip
    lines = [tabulate(body, head, tablefmt="github", disable_numparse=True), ""]
    lines.append(
        "tok/s are priced with the pair's latency profile; A = mean accepted drafted tokens per round. "
        f"Best kept: the share of {BOOTSTRAP_RESAMPLES} bootstrap resamples of the report's prompts "
        "that keep the same best schedule. Half split: the schedule fastest on half of the report's "
        "prompts, on the other half, as a share of that half's fastest (mean over every split): what a "
        "choice made without seeing the prompts can reach of the best in hindsight. Round oracle: per "
        "visited round start, the best schedule's tokens/s over the better endpoint's, averaged."
    )
    metrics = {
        "n_reports": reports.height,
        "n_trajectories": trajectories.num_rows,
        "n_round_outcomes": rounds.num_rows,
        "mean_best_over_better_endpoint": float(reports["gain"].mean()) if reports.height else 0.0,
        "mean_best_kept": float(np.mean(list(stability.values()))) if stability else 0.0,
        **(
            {"mean_half_split": float(np.mean(list(halves.values()))), "min_half_split": min(halves.values())}
            if halves
            else {}
        ),
        "reports": {
            r: {
                "best_schedule": s,
                "best_over_better_endpoint": g,
                "best_kept": stability[r],
                **({"half_split": halves[r]} if r in halves else {}),
            }
            for r, s, g in reports.select("report_id", "best_schedule", "gain").iter_rows()
        },
    }
    return "\n".join(lines), metrics


def _fmt(row: dict, which: str) -> str:
    return f"{row[which + '_tps']:.1f} ({row[which + '_a']:.2f})"
