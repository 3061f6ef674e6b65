"""distill's offline table (offline.md and offline.csv's rows), built of the stage's metrics.

Pure text: every number comes from models.distill_metrics (the policies' walks on the canonical
states, the training-set choice) and models.gate (the decision-priced round walks).
"""

from __future__ import annotations

from tabulate import tabulate

from models.distill_metrics import LABELS, Results, vs_endpoint
from models.gate import parse_backoff_key
from models.offline import summary


def offline_policies(results: Results) -> list[str]:
    """The table's policies, in :data:`models.distill_metrics.LABELS` order."""
    return [p for p in LABELS if p in next(iter(results.values()))]


def offline_rows(results: Results) -> list[dict]:
    """offline.csv: per report, each policy's realised tok/s."""
    policies = offline_policies(results)
    return [{"report_id": r, **{p: row[p].tok_per_s for p in policies}} for r, row in results.items()]


def offline_markdown(results: Results, train_set: dict, metrics: dict) -> str:
    """offline.md: the policies' summary, the training-set choice, the round walks, per report."""
    policies = offline_policies(results)
    summ, gaps = summary(results), vs_endpoint(results)
    lines = _table(
        ["policy", "mean tok/s", "% of best (mean of ratios)", "worst report vs better endpoint"],
        [
            [
                LABELS[p],
                f"{summ[p]['mean_tok_per_s']:.2f}",
                f"{summ[p]['mean_pct_of_best']:.1f}%",
                f"{gaps[p]['min_pct']:+.1f}%" if p in gaps else "",
            ]
            for p in policies
        ],
    )
    lines += _train_set_lines(train_set)
    lines += _gate_lines(metrics)
    lines += _by_report_lines(metrics)
    per_report = _table(
        ["report", *(LABELS[p] for p in policies)],
        [
            [report, *(f"{row[p].tok_per_s:.2f} ({row[p].schedule})" for p in policies)]
            for report, row in results.items()
        ],
    )
    lines += ["", *per_report]
    return (
        "\n".join(lines) + "\n\nCells: realised tok/s (reached schedule, step 1 first). Every row except "
        "the last decides each report with models that never saw it (leave-one-pair-out: never saw its "
        "pair); signal subsets and thresholds were chosen without the held-out fold.\n"
    )


def _train_set_lines(ts: dict) -> list[str]:
    lines = [
        "",
        f"Training states (out of fold, same folds, chosen by the {ts['selected_by']} walk; exported: "
        f"**{ts['winner']}**, loss {ts['exported_loss']}"
        + (
            f", the best walk ahead of the runner-up by {ts['margin_over_runner_up_pct']:.2f} points"
            if ts["margin_over_runner_up_pct"] is not None
            else ""
        )
        + (
            f"; the best walk, {ts['best_walk']}, leads both by {ts['best_lead_over_both_pct']:+.2f} points, "
            f"one standard error {ts['best_lead_over_both_se']:.2f}: both unless the lead is larger"
            if ts.get("best_walk") not in (None, "both")
            else ""
        )
        + (
            f"; the MSE student leads the thresholded one ({ts.get('mse_lead_vs')}) by "
            f"{ts.get('mse_lead_pct', 0.0):+.2f} points, one "
            f"standard error {ts['mse_lead_se']:.2f}: the MSE student only if the lead is larger"
            if "mse_lead_pct" in ts
            else ""
        )
        + (
            f"; with the n-gram lookahead the {ts['lookahead_lead_vs']} student's round walk leads the same "
            f"set's without it by "
            f"{ts['lookahead_lead_pct']:+.2f} points, one standard error {ts['lookahead_lead_se']:.2f}"
            if "lookahead_lead_pct" in ts
            else ""
        )
        + "):",
        "",
    ]
    walks = ts.get("round_walk_pct_of_oracle", {})
    body = [
        [
            n,
            f"{pct:.1f}%",
            f"{walks[n]:.1f}%" if n in walks else "",
            f"{100 * ts['oof_invoke_share'][n]:.1f}%",
            ", ".join(f"{t:.2f}" for t in ts["fold_thresholds"][n]),
        ]
        for n, pct in ts["oof_pct_of_best"].items()
    ]
    if "mse" in walks:
        body.append(["MSE + threshold 0, canonical (loss auto's other)", "", f"{walks['mse']:.1f}%", "", ""])
    if "no_lookahead" in walks:
        body.append(
            [
                f"{ts['lookahead_lead_vs']} without the n-gram lookahead (set to 0)",
                f"{ts['no_lookahead_oof_pct_of_best']:.1f}%",
                f"{walks['no_lookahead']:.1f}%",
                "",
                "",
            ]
        )
    if "all_small" in walks:
        body.append(["All-Small (reference)", "", f"{walks['all_small']:.1f}%", "0.0%", ""])
    head = [
        "training states",
        "% of best (walked, canonical states)",
        "% of the round oracle (walked, round starts)",
        "invoke share",
        "fold thresholds",
    ]
    return lines + _table(head, body)


def _gate_lines(metrics: dict) -> list[str]:
    walks = metrics.get("decision_priced_walk_pct") or {}
    if not walks:
        return []
    g, c = metrics["skip_rest_below"], metrics.get("skip_rounds_max", 0)
    h = metrics.get("skip_rounds_margin", 0.0)
    chosen = "decide every step" if g is None else f"skip the rest of a round below threshold - {g:.4g}"
    cap = metrics.get("skip_rest_max_target_ms")
    if g is not None and cap is not None:
        chosen += f", where the runtime target_ms is at most {cap:.3g}"
    noise = metrics.get("skip_rest_noise") or {}
    if noise.get("reports"):
        chosen += (
            f"; deciding every step leads the best gate by {noise['none_lead']:+.2f} points, one standard "
            f"error {noise['none_lead_se']:.2f} over {noise['reports']} reports: a gate unless the lead "
            f"is larger"
        )
    backoff = (
        "decide every round"
        if c == 0
        else f"after k idle rounds in a row (no decided margin above threshold - {h:.4g}) skip the next "
        f"min(2^k - 1, {c}) rounds"
    )
    lines = [
        "",
        f"Decision-priced round walk (out of fold; the student pays each decision it takes, a fixed "
        f"schedule none; the round oracle's ms per token over the starts / the walk's). "
        f"Exported: **{chosen}**; cross-round "
        f"backoff (skip_rounds_max and skip_rounds_margin, chosen with that gate, skip-runs counted in "
        f"round-table starts): "
        f"**{backoff}**.",
        "",
    ]
    lines += _table(
        ["rule", "% of the round oracle"],
        [[name, f"{v:.2f}%"] for name, v in walks.items() if parse_backoff_key(name) is None],
    )
    grid: dict[int, dict[float, float]] = {}
    for name, v in walks.items():
        if (ch := parse_backoff_key(name)) is not None:
            grid.setdefault(ch[0], {})[ch[1]] = v
    margins = sorted({m for row in grid.values() for m in row})
    lines += [
        "",
        "Cross-round backoff, % of the round oracle: cap c (rows) x idle margin h (columns; c = 0 never "
        "skips).",
        "",
    ]
    return lines + _table(
        ["c", *(f"h = {m:.3g}" for m in margins)],
        [
            [str(c), *(f"{row[m]:.2f}%" if m in row else "" for m in margins)]
            for c, row in sorted(grid.items())
        ],
    )


def _by_report_lines(metrics: dict) -> list[str]:
    rows, vs = metrics.get("round_walk_by_report") or [], metrics.get("round_walk_vs_fixed") or {}
    if not rows:
        return []
    n_fixed = 2 ** len(rows[0]["best_schedule"])
    lines = [
        "",
        "Per report, the exported student's decision-priced round walk out of fold (its gate and "
        "backoff) against the fixed schedules, % of the round oracle (best fixed: the report's best of "
        f"all {n_fixed} in hindsight). Against the better endpoint: mean "
        f"{vs['vs_better_endpoint_mean_pct']:+.1f}%, worst {vs['vs_better_endpoint_worst_pct']:+.1f}%, "
        f"within 1% on {vs['within_1pct_of_better_endpoint']} of {vs['reports']} reports; against the "
        f"best fixed schedule: mean {vs['vs_best_fixed_mean_pct']:+.1f}%, worst "
        f"{vs['vs_best_fixed_worst_pct']:+.1f}%, within 1% on {vs['within_1pct_of_best_fixed']}.",
        "",
    ]
    head = [
        "report", "student", "All-Small", "All-Mid", "best fixed (schedule)", "vs better endpoint",
        "vs best fixed",
    ]  # fmt: skip
    body = [
        [
            r["report_id"],
            f"{r['student']:.1f}%",
            f"{r['all_small']:.1f}%",
            f"{r['all_mid']:.1f}%",
            f"{r['best_fixed']:.1f}% ({r['best_schedule']})",
            f"{r['vs_better_endpoint_pct']:+.1f}%",
            f"{r['vs_best_fixed_pct']:+.1f}%",
        ]
        for r in rows
    ]
    return lines + _table(head, body)


def _table(head: list[str], body: list[list[str]]) -> list[str]:
    """A GitHub markdown table's lines; every cell is printed as given (no number parsing)."""
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True).split("\n")
