"""Tables, summary numbers and plots of the evaluate stage, from its result rows (pure functions).

Each result row is one method on one (pair, dataset) cell, with `is_held_out_pair` and
`is_held_out_task`. The student's gain is measured against the better of the two fixed endpoints
(All-Small, All-Mid) on the same cell, as in the paper.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from collectors.plots import new_figure

MAIN_METHODS = ("all-small", "all-mid", "10101", "best-fixed", "value-planner", "student")
ABLATIONS = ("full", "no-eg", "overwrite", "cascade")


def cells(rows: list[dict]) -> dict[tuple[str, str], dict[str, dict]]:
    out: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        out[r["pair_id"], r["dataset_id"]][r["method"]] = r
    return out


def group_of(row: dict) -> str:
    if row["is_held_out_pair"] and row["is_held_out_task"]:
        return "held-out pair and task"
    if row["is_held_out_pair"]:
        return "held-out pair"
    if row["is_held_out_task"]:
        return "held-out task"
    return "fitting"


def student_gains(rows: list[dict], key: str = "speedup") -> dict[str, list[float]]:
    """Student / better endpoint, per group of cells."""
    gains: dict[str, list[float]] = defaultdict(list)
    for methods in cells(rows).values():
        if "student" in methods:
            end = max(methods["all-small"][key], methods["all-mid"][key])
            gains[group_of(methods["student"])].append(methods["student"][key] / end)
    return gains


def summary_metrics(rows: list[dict]) -> dict:
    out = {}
    for key in ("speedup", "priced_speedup"):
        for group, g in student_gains(rows, key).items():
            name = f"{key}.{group.replace(' ', '_')}"
            out[name] = {
                "student_gain_mean": mean(g),
                "student_gain_best": max(g),
                "student_gain_worst": min(g),
                "n_cells": len(g),
            }
    for m in MAIN_METHODS:
        vals = [r["speedup"] for r in rows if r["method"] == m]
        if vals:
            out.setdefault("mean_speedup", {})[m] = mean(vals)
    return out


def main_table(rows: list[dict], key: str = "speedup") -> str:
    """Markdown: one line per cell, speedup over AR (mean accepted length) per method."""
    head = "| pair | dataset | group | " + " | ".join(MAIN_METHODS) + " | student vs better end |"
    lines = [head, "|" + "---|" * (len(MAIN_METHODS) + 4)]
    for (pair, dataset), methods in sorted(
        cells(rows).items(), key=lambda kv: (group_of(next(iter(kv[1].values()))), kv[0])
    ):
        if "student" not in methods:
            continue
        vals = [_cell(methods.get(m), key) for m in MAIN_METHODS]
        end = max(methods["all-small"][key], methods["all-mid"][key])
        gain = methods["student"][key] / end - 1
        lines.append(
            f"| {pair} | {dataset} | {group_of(methods['student'])} | "
            + " | ".join(vals)
            + f" | {gain:+.1%} |"
        )
    return "\n".join(lines)


def _cell(row: dict | None, key: str) -> str:
    return f"{row[key]:.2f}x ({row['mean_accepted_length']:.2f})" if row else "-"


def ablation_table(rows: list[dict]) -> str:
    head = "| pair | dataset | method | speedup | A | mid pool (nodes) | historical picks |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for (pair, dataset), methods in sorted(cells(rows).items()):
        for m in ABLATIONS:
            if m in methods:
                r = methods[m]
                lines.append(
                    f"| {pair} | {dataset} | {m} | {r['speedup']:.2f}x | {r['mean_accepted_length']:.2f} | "
                    f"{r['mid_pool_mean']:.1f} | {r['historical_pick_share']:.1%} |"
                )
    return "\n".join(lines)


def speedup_plot(rows: list[dict], path) -> object:
    """Grouped bars: speedup per method, one group per pair (averaged over datasets)."""
    by_pair: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["method"] in MAIN_METHODS:
            by_pair[r["pair_id"]][r["method"]].append(r["speedup"])
    pairs = sorted(by_pair)
    fig, ax = new_figure(8, 4)
    width = 0.8 / len(MAIN_METHODS)
    for i, m in enumerate(MAIN_METHODS):
        heights = [mean(by_pair[p][m]) if by_pair[p][m] else 0 for p in pairs]
        ax.bar([p + i * width for p in range(len(pairs))], heights, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([p + 0.4 - width / 2 for p in range(len(pairs))], pairs)
    ax.set_ylabel("speedup over autoregressive (wall clock)")
    ax.legend(fontsize=7, ncols=3)
    fig.savefig(path, dpi=120)
    return fig


def calls_plot(rows: list[dict], depth: int, path) -> object:
    """The student's mid-call rate at each drafting step, one line per pair."""
    rates: dict[str, list[list[float]]] = defaultdict(list)
    for r in rows:
        if r["method"] == "student":
            rates[r["pair_id"]].append(r["mid_calls_per_step"])
    fig, ax = new_figure(6, 4)
    for pair, per_cell in sorted(rates.items()):
        ax.plot(
            range(1, depth + 1), [mean(c[k] for c in per_cell) for k in range(depth)], marker="o", label=pair
        )
    ax.set_xlabel("drafting step k")
    ax.set_ylabel("share of rounds calling the mid drafter")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    fig.savefig(path, dpi=120)
    return fig


def plot_rows(rows: list[dict], depth: int) -> tuple[list[dict], list[dict]]:
    """CSV rows for `dvc plots`: speedup per (pair, dataset, method); student calls per step."""
    speed = [
        {"cell": f"{r['pair_id']}/{r['dataset_id']}", "method": r["method"], "speedup": r["speedup"]}
        for r in rows
    ]
    calls = [
        {
            "cell": f"{r['pair_id']}/{r['dataset_id']}",
            "step": k + 1,
            "mid_call_rate": r["mid_calls_per_step"][k],
        }
        for r in rows
        if r["method"] == "student"
        for k in range(depth)
    ]
    return speed, calls
