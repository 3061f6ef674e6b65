"""Tables, summary numbers and plots of the evaluate stage, from its result rows (pure functions).

Each result row is one method on one (pair, dataset) cell, with `is_held_out_pair` and
`is_held_out_task`. The number is ``priced_speedup`` (exact replay counts x the latency profile,
every method, with ``priced_ci_low``/``priced_ci_high``); ablation rows, decoded for real, have the
wall-clock ``speedup``. The student's gain is measured against the better of the two fixed
endpoints (All-Small, All-Mid) on the same cell, as in the paper, and against the best fixed
schedule in hindsight; so is the ``deployed`` row's (per pair, the student at the pair's threshold
or the better endpoint, whichever the pair check on calibration prompts chose, named in
``deployed_as``: a copy of that method's row). Rows become one polars frame (a later row of the
same cell and method replaces an earlier one); grouping and means are polars expressions. Markdown
tables are tabulate's GitHub format.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import polars as pl
from tabulate import tabulate

from collectors.evaluation.plots import new_figure

if TYPE_CHECKING:
    from collectors.evaluation.priced_eval import PricedCell

DEPLOYED = "deployed"  # per pair, the row of what its deployment bundle deploys (the pair check's)
ADAPTIVE = "adaptive"  # per pair, the online adaptive rule at the thresholds its pair check chose
BUDGET = "budget"  # the pair's own budget-stage schedule (collectors.evaluation.priced_tasks.fixed_for)
MAIN_METHODS = ("all-small", "all-mid", "10101", BUDGET, "best-fixed", ADAPTIVE, "value-planner", "student",
                DEPLOYED)  # fmt: skip
LEARNED = ("student", "deployed")  # the rows whose gains are reported
ABLATIONS = ("full", "no-eg", "overwrite", "cascade")
CELL = ("pair_id", "dataset_id")

_HELD_PAIR, _HELD_TASK = pl.col("is_held_out_pair"), pl.col("is_held_out_task")
GROUP = (
    pl.when(_HELD_PAIR & _HELD_TASK)
    .then(pl.lit("held-out pair and task"))
    .when(_HELD_PAIR)
    .then(pl.lit("held-out pair"))
    .when(_HELD_TASK)
    .then(pl.lit("held-out task"))
    .otherwise(pl.lit("fitting"))
)


# The columns these functions read (the schema of an empty frame).
_COLUMNS = {
    **dict.fromkeys(("pair_id", "dataset_id", "method"), pl.String),
    **dict.fromkeys(("is_held_out_pair", "is_held_out_task"), pl.Boolean),
    **dict.fromkeys(
        ("speedup", "priced_speedup", "mean_accepted_length", "mid_pool_mean", "historical_pick_share"),
        pl.Float64,
    ),
    "mid_calls_per_step": pl.List(pl.Float64),
}


def cell_groups(rows: list[dict]) -> dict[tuple[str, str], str]:
    """Each cell's group (fitting, held-out pair, held-out task, held-out pair and task)."""
    frame = result_frame(rows).select(*CELL, "group").unique(CELL, maintain_order=True)
    return {(p, d): g for p, d, g in frame.iter_rows()}


def result_frame(rows: list[dict]) -> pl.DataFrame:
    """The result rows in their order, one per (cell, method), with each row's ``group``."""
    frame = pl.from_dicts(rows, infer_schema_length=None) if rows else pl.DataFrame(schema=_COLUMNS)
    return frame.unique([*CELL, "method"], keep="last", maintain_order=True).with_columns(group=GROUP)


def priced_rows(cell: PricedCell, n_boot: int) -> dict[str, dict]:
    """Per method of the priced cell, its row: the priced speedup with its 95% interval, tokens,
    priced tokens/s, mean accepted length and the mid-call rates."""
    out = {}
    for name, (point, low, high) in cell.speedups(n_boot).items():
        m = cell.methods[name]
        out[name] = {
            "method": name,
            "schedule": m.schedule,
            "n_prompts": len(m.ms),
            "n_tokens": int(m.tokens.sum()),
            "priced_tokens_per_s": 1e3 * float(m.tokens.sum() / m.ms.sum()),
            "priced_speedup": point,
            "priced_ci_low": low,
            "priced_ci_high": high,
            "mean_accepted_length": m.accepted,
            "mid_call_rate": float(sum(m.mid_calls_per_step) / len(m.mid_calls_per_step)),
            "mid_calls_per_step": list(m.mid_calls_per_step),
        }
    return out


def cell_rows(
    cell: PricedCell, n_boot: int, deploys: str, drop: Collection[str] = (), adaptive: str | None = None
) -> list[dict]:
    """The cell's rows (:func:`priced_rows`) but the methods in ``drop``, then the ``deployed`` row:
    a copy of the row of ``deploys`` (the method the pair's bundle deploys), with ``deployed_as``;
    with ``adaptive`` (the adaptive variant the pair's bundle chose), its copy as the ``adaptive``
    row, with ``adaptive_as``."""
    rows = priced_rows(cell, n_boot)
    for what, name in (("deploys", deploys), ("chose the adaptive rule", adaptive)):
        if name is not None and name not in rows:
            raise ValueError(f"the pair {what} {name!r}, which this cell did not price: {sorted(rows)}")
    kept = [r for name, r in rows.items() if name not in drop]
    chosen = [] if adaptive is None else [{**rows[adaptive], "method": ADAPTIVE, "adaptive_as": adaptive}]
    return [*kept, *chosen, {**rows[deploys], "method": DEPLOYED, "deployed_as": deploys}]


def _of(method: str, expr: pl.Expr) -> pl.Expr:
    return expr.filter(pl.col("method") == method).last()


def cell_frame(rows: list[dict], key: str = "priced_speedup", learned: str = "student") -> pl.DataFrame:
    """One row per cell that has a ``learned`` row (the student, or the deployed row), in first-seen
    order: the endpoints' and its ``key`` (``value_*``; ``value_student`` is the learned row's), its
    group, the cell's first row's group (``sort_group``), each main method's (key, mean accepted
    length) and the gain."""
    return (
        result_frame(rows)
        .group_by(CELL, maintain_order=True)
        .agg(
            value_small=_of("all-small", pl.col(key)),
            value_mid=_of("all-mid", pl.col(key)),
            value_student=_of(learned, pl.col(key)),
            value_best_fixed=_of("best-fixed", pl.col(key)),
            value_adaptive=_of(ADAPTIVE, pl.col(key)),
            group=_of(learned, pl.col("group")),
            sort_group=pl.col("group").first(),
            **{m: _of(m, pl.struct(key, "mean_accepted_length")) for m in MAIN_METHODS},
        )
        .filter(pl.col("value_student").is_not_null())
        .with_columns(
            gain=pl.col("value_student") / pl.max_horizontal("value_small", "value_mid"),
            gain_best_fixed=pl.col("value_student") / pl.col("value_best_fixed"),
            gain_adaptive=pl.col("value_student") / pl.col("value_adaptive"),
        )
    )


def student_gains(rows: list[dict], key: str = "priced_speedup") -> dict[str, list[float]]:
    """Student / better endpoint, per group of cells."""
    per_group = cell_frame(rows, key).group_by("group", maintain_order=True).agg("gain")
    return dict(per_group.iter_rows())


def metric_prefix(key: str, learned: str = "student") -> str:
    """The summary metrics' key prefix of a learned row's gains: ``priced_speedup.`` for the
    student, ``deployed.priced_speedup.`` for the deployed row."""
    return f"{key}." if learned == "student" else f"{learned}.{key}."


def summary_metrics(rows: list[dict]) -> dict:
    """Per learned row (student, deployed) and group of cells, its priced gain over the better
    endpoint (mean, best, worst), the share of cells where it is at least the best fixed schedule
    in hindsight and the cell count; then every main method's mean priced speedup."""
    out = {}
    key = "priced_speedup"
    for learned in LEARNED:
        stats = (
            cell_frame(rows, key, learned)
            .group_by("group", maintain_order=True)
            .agg(
                student_gain_mean=pl.col("gain").mean(),
                student_gain_best=pl.col("gain").max(),
                student_gain_worst=pl.col("gain").min(),
                # share of cells where the student is at least the best fixed schedule in hindsight
                student_at_least_best_fixed=(pl.col("gain_best_fixed") >= 1.0).mean(),
                # over the online adaptive rule (no training), where it was priced
                student_vs_adaptive_mean=pl.col("gain_adaptive").mean(),
                student_vs_adaptive_worst=pl.col("gain_adaptive").min(),
                n_cells=pl.len(),
            )
        )
        for s in stats.iter_rows(named=True):
            out[metric_prefix(key, learned) + s.pop("group").replace(" ", "_")] = s
    means = dict(
        result_frame(rows)
        .filter(pl.col("method").is_in(MAIN_METHODS) & pl.col(key).is_not_null())
        .group_by("method")
        .agg(pl.col(key).mean())
        .iter_rows()
    )
    if means:
        out[f"mean_{key}"] = {m: means[m] for m in MAIN_METHODS if m in means}
    return out


def _markdown(head: list[str], body: list[list[str]]) -> str:
    """A GitHub-format Markdown table of ready-formatted cells (no number parsing)."""
    return tabulate(body, head, tablefmt="github", disable_numparse=True)


def main_table(rows: list[dict]) -> str:
    """Markdown: one line per cell, priced speedup over AR (mean accepted length) per method, the
    student's 95% interval and its gain over the better endpoint and over the best fixed schedule,
    and the deployed row's gain over the better endpoint."""
    key = "priced_speedup"
    head = ["pair", "dataset", "group", *MAIN_METHODS, "student 95% CI", "vs better end", "vs best fixed",
            "deployed vs better end", "deployed vs adaptive"]  # fmt: skip
    deployed = {
        (c["pair_id"], c["dataset_id"]): (c["gain"], c["gain_adaptive"])
        for c in cell_frame(rows, key, "deployed").iter_rows(named=True)
    }
    ci = {
        (r["pair_id"], r["dataset_id"]): (r.get("priced_ci_low"), r.get("priced_ci_high"))
        for r in rows
        if r["method"] == "student"
    }
    body = []
    for c in cell_frame(rows, key).sort("sort_group", *CELL).iter_rows(named=True):
        vals = [_cell(c[m], key) for m in MAIN_METHODS]
        lo, hi = ci.get((c["pair_id"], c["dataset_id"]), (None, None))
        interval = f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "-"
        vs_best = f"{c['gain_best_fixed'] - 1:+.1%}" if c["gain_best_fixed"] is not None else "-"
        gain_deployed, over_adaptive = deployed.get((c["pair_id"], c["dataset_id"]), (None, None))
        vs_deployed = f"{gain_deployed - 1:+.1%}" if gain_deployed is not None else "-"
        vs_adaptive = f"{over_adaptive - 1:+.1%}" if over_adaptive is not None else "-"
        body.append([c["pair_id"], c["dataset_id"], c["group"], *vals, interval, f"{c['gain'] - 1:+.1%}",
                     vs_best, vs_deployed, vs_adaptive])  # fmt: skip
    return _markdown(head, body)


def _cell(row: dict | None, key: str) -> str:
    return f"{row[key]:.2f}x ({row['mean_accepted_length']:.2f})" if row and row[key] is not None else "-"


def ablation_table(rows: list[dict]) -> str:
    """Markdown: per cell in method order, the ablation's wall-clock speedup over AR, its mean
    accepted length, mid pool size and share of historical picks."""
    head = ["pair", "dataset", "method", "speedup", "A", "mid pool (nodes)", "historical picks"]
    rank = pl.col("method").replace_strict({m: i for i, m in enumerate(ABLATIONS)}, return_dtype=pl.Int64)
    table = result_frame(rows).filter(pl.col("method").is_in(ABLATIONS)).sort(*CELL, rank)
    body = [
        [r["pair_id"], r["dataset_id"], r["method"], f"{r['speedup']:.2f}x",
         f"{r['mean_accepted_length']:.2f}", f"{r['mid_pool_mean']:.1f}", f"{r['historical_pick_share']:.1%}"]
        for r in table.iter_rows(named=True)
    ]  # fmt: skip
    return _markdown(head, body)


def speedup_plot(rows: list[dict], path) -> object:
    """Grouped bars: priced speedup per method, one group per pair (averaged over datasets)."""
    means = (
        result_frame(rows)
        .filter(pl.col("method").is_in(MAIN_METHODS))
        .group_by("pair_id", "method")
        .agg(pl.col("priced_speedup").mean())
    )
    height = {(p, m): s for p, m, s in means.iter_rows()}
    pairs = sorted({p for p, _ in height})
    fig, ax = new_figure(8, 4)
    width = 0.8 / len(MAIN_METHODS)
    for i, m in enumerate(MAIN_METHODS):
        heights = [height.get((p, m), 0) for p in pairs]
        ax.bar([p + i * width for p in range(len(pairs))], heights, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([p + 0.4 - width / 2 for p in range(len(pairs))], pairs)
    ax.set_ylabel("speedup over autoregressive (priced)")
    ax.legend(fontsize=7, ncols=3)
    fig.savefig(path, dpi=120)
    return fig


def calls_plot(rows: list[dict], depth: int, path) -> object:
    """The student's mid-call rate at each drafting step, one line per pair."""
    rates = (
        result_frame(rows)
        .filter(pl.col("method") == "student")
        .group_by("pair_id")
        .agg(pl.concat_list([pl.col("mid_calls_per_step").list.get(k).mean() for k in range(depth)]))
        .sort("pair_id")
    )
    fig, ax = new_figure(6, 4)
    for pair, per_step in rates.iter_rows():
        ax.plot(range(1, depth + 1), per_step, marker="o", label=pair)
    ax.set_xlabel("drafting step k")
    ax.set_ylabel("share of rounds calling the mid drafter")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    fig.savefig(path, dpi=120)
    return fig


def plot_rows(rows: list[dict], depth: int) -> tuple[list[dict], list[dict]]:
    """CSV rows for `dvc plots`: priced speedup per (pair, dataset, method); student calls per step."""
    frame = result_frame(rows).with_columns(cell=pl.format("{}/{}", *CELL))
    speed = frame.select("cell", "method", "priced_speedup").to_dicts()
    calls = (
        frame.filter(pl.col("method") == "student")
        .select(
            "cell",
            step=pl.int_ranges(1, depth + 1),
            mid_call_rate=pl.col("mid_calls_per_step").list.head(depth),
        )
        .explode("step", "mid_call_rate")
        .to_dicts()
    )
    return speed, calls
