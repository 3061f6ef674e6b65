"""What the budget stage reports of its budgets.json entries: the table, the curves and metrics.

Contract: :func:`markdown` is budgets.md, one GitHub table row per pair (a pair of ``mode: fixed``
shows its budget and dashes); :func:`curve_rows` the plot data for dvc plots (pair, policy, budget,
priced speedup; :data:`CURVE_COLUMNS`); :func:`curve_plot` the priced speedup of the better policy
per budget, one line per measured pair with B* marked; :func:`summary` the metrics. Pure but for
the figure, which :func:`curve_plot` saves.
"""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from collectors.evaluation.plots import new_figure

CURVE_COLUMNS = ("pair_id", "policy", "budget", "priced_speedup")


def markdown(entries: dict[str, dict], b_max: int) -> str:
    """budgets.md: one row per pair (a fixed-mode pair shows its budget and dashes)."""
    head = [
        "pair", "B*", "W x m", "policy", "speedup @ B*", f"speedup @ B={b_max}", "gain", "SABA B",
        "speedup @ SABA", "best B per policy", "per-round rule", "decodes with",
    ]  # fmt: skip
    fixed = ["-", "fixed", *["-"] * 8]  # W x m through decodes with
    body = [
        [pair_id, str(e["budget"]), *fixed] if e["mode"] == "fixed" else measured_row(pair_id, e)
        for pair_id, e in entries.items()
    ]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n"


def measured_row(pair_id: str, e: dict) -> list[str]:
    """A measured pair's cells, each formatted as budgets.md prints it."""
    per = ", ".join(f"{n} {p['best_budget']} ({p['best_speedup']:.2f}x)" for n, p in e["policies"].items())
    min_n = e.get("ngram_min_n", 1)
    shape = f"{e['width']} x {e['topk']}" + (f", n-gram n >= {min_n}" if min_n > 1 else "")
    return [
        pair_id,
        str(e["budget"]),
        shape,
        e["policy"],
        f"{e['speedup_at_budget']:.2f}x",
        f"{e['speedup_at_max']:.2f}x",
        f"{e['speedup_at_budget'] / e['speedup_at_max']:.2f}",
        f"{e['saba_budget']} ({e['saba_policy']})",
        f"{e['speedup_at_saba']:.2f}x",
        per,
        rule_text(e),
        e["decode_policy"],
    ]


def rule_text(e: dict) -> str:
    """The per-round rule column: on (B_t <= cap; the fixed B's speedup), or the best tried, or -."""
    tried = e.get("round_rule_tried")
    if e.get("round_budget") is not None:
        return f"on, B_t <= {e['budget']} (fixed B: {e['speedup_fixed_budget']:.2f}x)"
    if tried:
        return f"off (best tried {tried['speedup']:.2f}x)"
    return "-"


def curve_rows(entries: dict[str, dict]) -> list[dict]:
    """One row per (pair, policy, budget): the plot's data for dvc plots."""
    return [
        dict(zip(CURVE_COLUMNS, (pair_id, name, b, s), strict=True))
        for pair_id, e in entries.items()
        for name, p in e.get("policies", {}).items()
        for b, s in enumerate(p["speedup"], start=1)
    ]


def curve_plot(entries: dict[str, dict], path: Path) -> object:
    """Priced speedup over AR vs budget, the better policy per budget, one line per pair; B* marked."""
    fig, ax = new_figure(8, 4)
    for pair_id, e in entries.items():
        if e["mode"] == "fixed":
            continue
        best = [max(c) for c in zip(*(p["speedup"] for p in e["policies"].values()), strict=True)]
        (line,) = ax.plot(range(1, len(best) + 1), best, label=pair_id)
        ax.plot([e["budget"]], [e["speedup_at_budget"]], "o", color=line.get_color())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verification budget B (nodes besides the root)")
    ax.set_ylabel("priced speedup over AR (better of All-Small, All-Mid)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncols=2)
    fig.savefig(path, dpi=120)
    return fig


def summary(entries: dict[str, dict]) -> dict:
    """metrics.json: the pairs measured, the mean speedups and gain over them, and each pair's
    budgets and speedups."""
    measured = {k: e for k, e in entries.items() if e["mode"] == "measured"}
    metrics: dict = {"n_pairs": len(entries), "n_measured": len(measured)}
    if measured:
        for key in ("speedup_at_budget", "speedup_at_max", "speedup_at_saba"):
            metrics[f"mean_{key}"] = sum(e[key] for e in measured.values()) / len(measured)
        metrics["mean_gain"] = sum(
            e["speedup_at_budget"] / e["speedup_at_max"] for e in measured.values()
        ) / len(measured)
    keys = ("budget", "saba_budget", "speedup_at_budget", "speedup_at_max", "speedup_at_saba")
    metrics["pairs"] = {k: {f: e[f] for f in keys if f in e} for k, e in entries.items()}
    return metrics
