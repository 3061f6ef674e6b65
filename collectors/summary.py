"""The collect stage's closing table: per report, the best fixed schedule against the endpoints,
and the per-round hindsight oracle from the round-level table (an upper bound for any per-step
scheduler). Pure functions over the merged tables."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa


def summarise(trajectories: pa.Table, rounds: pa.Table) -> tuple[str, dict]:
    """A markdown table and a metrics dict."""
    by_report: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in trajectories.to_pylist():
        by_report[row["report_id"]][row["schedule_id"]] = row
    oracle = _round_oracle(rounds)
    lines = [
        "| report | All-Small tok/s (A) | All-Mid tok/s (A) | best schedule | best tok/s (A) "
        "| best / better end | round oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    gains = []
    per_report = {}
    for report, rows in by_report.items():
        small, mid = rows[0], rows[max(rows)]
        best = max(rows.values(), key=lambda r: (r["throughput_tok_per_s"], -r["schedule_id"]))
        end = max(small["throughput_tok_per_s"], mid["throughput_tok_per_s"])
        gain = best["throughput_tok_per_s"] / end
        gains.append(gain)
        per_report[report] = {"best_schedule": best["schedule"], "best_over_better_endpoint": gain}
        orc = f"{oracle[report]:.2f}x" if report in oracle else "-"
        lines.append(
            f"| {report} | {_fmt(small)} | {_fmt(mid)} | {best['schedule']} | {_fmt(best)} "
            f"| {gain:.3f}x | {orc} |"
        )
    lines.append("")
    lines.append(
        "tok/s are priced with the pair's latency profile; A = mean accepted drafted tokens per round. "
        "Round oracle: per visited round start, the best schedule's tokens/s over the better "
        "endpoint's, averaged."
    )
    metrics = {
        "n_reports": len(by_report),
        "n_trajectories": trajectories.num_rows,
        "n_round_outcomes": rounds.num_rows,
        "mean_best_over_better_endpoint": sum(gains) / len(gains) if gains else 0.0,
        "reports": per_report,
    }
    return "\n".join(lines), metrics


def _fmt(row: dict) -> str:
    return f"{row['throughput_tok_per_s']:.1f} ({row['mean_accepted_length']:.2f})"


def _round_oracle(rounds: pa.Table) -> dict[str, float]:
    """Mean over round starts of best tokens/s / better endpoint tokens/s, per report."""
    starts: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rounds.select(
        ["report_id", "prompt_id", "start_position", "schedule_id", "throughput_tok_per_s"]
    ).to_pylist():
        starts[r["report_id"], r["prompt_id"], r["start_position"]][r["schedule_id"]] = r[
            "throughput_tok_per_s"
        ]
    ratios: dict[str, list[float]] = defaultdict(list)
    for (report, _, _), tps in starts.items():
        end = max(tps[0], tps[max(tps)])
        ratios[report].append(max(tps.values()) / end)
    return {r: sum(v) / len(v) for r, v in ratios.items()}
