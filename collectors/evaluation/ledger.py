"""The results ledger: one row per reported pipeline run, newest first, with its headline figures.

Contract: a row is the run's date, the commit its code is (pipeline/record.py), dvc.lock's sha256,
the MLflow run id (empty for a run imported from docs/LOG.md), where the row came from, and the
figures of the README's headline table (:data:`FIGURES`; a figure a run did not produce is left
empty, never invented). The ledger is a CSV file with exactly :data:`COLUMNS`; the figures that can
carry a 95% interval (:data:`WITH_INTERVAL`) have ``_lo`` and ``_hi`` columns beside them, filled
where the metrics carry ``<key>_lo`` and ``<key>_hi``. :func:`add_run` puts a run on top (the row
of the same run, or of the same commit and lock for an imported run, is replaced, never doubled)
and keeps the rows newest first by date. Gains are ratios to the better fixed endpoint (1.092 is
+9.2%), speedups ratios to autoregressive decoding. Pure: pipeline/readme.py reads and writes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

from tabulate import tabulate

from collectors.evaluation.eval_report import metric_prefix
from collectors.evaluation.results_text import gain_text

GROUPS = ("fitting", "held-out_pair", "held-out_pair_and_task", "held-out_task")  # evaluate's groups
FIGURES = (
    "fitting_gain_mean",
    "fitting_gain_worst",
    "held_out_pair_gain_mean",
    "held_out_pair_gain_worst",
    "held_out_pair_and_task_gain_mean",
    "held_out_task_gain_mean",
    "held_out_task_gain_worst",
    "fitting_vs_adaptive_mean",
    "pricing_within",
    "pricing_rows",
    "graft_priced_speedup",
    "graft_wall_speedup",
    "graft_hindsight_speedup",
    "graft_vs_hindsight",
)
WITH_INTERVAL = frozenset(f for f in FIGURES if f.endswith(("_mean", "_worst", "_speedup", "_hindsight")))
META = ("date", "commit", "lock_sha256", "run_id", "source")
COLUMNS = (
    *META,
    *(c for f in FIGURES for c in ((f, f"{f}_lo", f"{f}_hi") if f in WITH_INTERVAL else (f,))),
)


@dataclass(frozen=True)
class Figure:
    value: float
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class LedgerRow:
    date: str  # YYYY-MM-DD
    commit: str
    lock_sha256: str
    run_id: str  # "" for a run imported from the log
    source: str
    figures: dict[str, Figure]  # names from FIGURES; a figure the run lacks is absent

    def key(self) -> tuple[str, ...]:
        return (self.run_id,) if self.run_id else (self.commit, self.lock_sha256)


def _figure(stats: dict, key: str) -> Figure:
    return Figure(float(stats[key]), stats.get(f"{key}_lo"), stats.get(f"{key}_hi"))


def _interval(v: Sequence[float]) -> Figure:
    """A headline figure stored as [point, low, high] (collectors/evaluation/headline.py)."""
    return Figure(float(v[0]), float(v[1]), float(v[2]))


def figures_of(ev_metrics: dict, graft_metrics: dict, wall_metrics: dict) -> dict[str, Figure]:
    """The headline figures of a run from the evaluate, evaluate_graft and wall_check metrics, as the
    README's table (collectors/evaluation/results_text.py headline_table) shows them: with their 95%
    intervals where the run priced its headline under every profile pass (``headline``)."""
    out: dict[str, Figure] = {}
    prefix = metric_prefix("priced_speedup", "deployed")
    spread = ev_metrics.get("headline", {})
    for group in GROUPS:
        stats, with_ci = ev_metrics.get(prefix + group), spread.get(group.replace("_", " "))
        if stats is None:
            continue
        name = group.replace("-", "_") + "_gain"
        for what in ("mean", "worst"):
            if f"{name}_{what}" in FIGURES:
                plain = _figure(stats, f"student_gain_{what}")
                out[f"{name}_{what}"] = _interval(with_ci[what]) if with_ci else plain
    if "vs_adaptive" in spread.get("fitting", {}):
        out["fitting_vs_adaptive_mean"] = _interval(spread["fitting"]["vs_adaptive"])
    if "graft_vs_hindsight" in graft_metrics:
        out["graft_vs_hindsight"] = _interval(graft_metrics["graft_vs_hindsight"])
    stage = wall_metrics.get("summary", {}).get("stage")
    if stage:
        out["pricing_within"], out["pricing_rows"] = Figure(stage["within"]), Figure(stage["rows"])
    speedups = {"graft_priced_speedup": graft_metrics["mean_speedup"], "graft_wall_speedup":
                graft_metrics.get("mean_wall_speedup", {})}  # fmt: skip
    for name, means in speedups.items():
        if "full" in means:
            out[name] = _figure(means, "full")
    if "hindsight" in graft_metrics["mean_speedup"]:
        out["graft_hindsight_speedup"] = _figure(graft_metrics["mean_speedup"], "hindsight")
    return out


def add_run(rows: Sequence[LedgerRow], row: LedgerRow) -> list[LedgerRow]:
    """``row`` on top of ``rows`` in place of any row of the same run; newest date first."""
    kept = [r for r in rows if r.key() != row.key()]
    return sorted([row, *kept], key=lambda r: r.date, reverse=True)  # stable: a new run tops its day


def _number(text: str) -> float | None:
    return float(text) if text else None


def read_ledger(text: str, where: str) -> list[LedgerRow]:
    """The rows of a ledger CSV; a header other than COLUMNS, or a row without date or commit, is a
    ValueError naming ``where``."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{where}: columns {reader.fieldnames} are not the ledger's {list(COLUMNS)}")
    rows = []
    for line, raw in enumerate(reader, start=2):
        if not raw["date"] or not raw["commit"] or None in raw.values():
            raise ValueError(f"{where}:{line}: a row needs a date, a commit and every column")
        figures = {
            f: Figure(float(raw[f]), _number(raw.get(f"{f}_lo", "")), _number(raw.get(f"{f}_hi", "")))
            for f in FIGURES
            if raw[f]
        }
        rows.append(LedgerRow(*(raw[m] for m in META), figures=figures))
    return rows


def _text(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write_ledger(rows: Sequence[LedgerRow]) -> str:
    """The CSV text of ``rows``: numbers as Python writes them (whole ones without a point), so they
    read back exactly."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells = {m: getattr(row, m) for m in META}
        for name, fig in row.figures.items():
            cells[name] = _text(fig.value)
            if name in WITH_INTERVAL:
                cells[f"{name}_lo"], cells[f"{name}_hi"] = _text(fig.lo), _text(fig.hi)
        writer.writerow(cells)
    return out.getvalue()


def _gain(fig: Figure | None) -> str:
    if fig is None:
        return "n/a"
    return gain_text(fig.value if fig.lo is None or fig.hi is None else (fig.value, fig.lo, fig.hi))


def _speedup(fig: Figure | None) -> str:
    if fig is None:
        return "n/a"
    interval = "" if fig.lo is None or fig.hi is None else f" [{fig.lo:.2f}, {fig.hi:.2f}]"
    return f"{fig.value:.2f}x{interval}"


def gain_words(row: LedgerRow, group: str) -> str:
    """A group's deployed gain as the ledger shows it: mean, then the worst cell where recorded."""
    name = group.replace("-", "_") + "_gain"
    worst = row.figures.get(f"{name}_worst")
    return _gain(row.figures.get(f"{name}_mean")) + ("" if worst is None else f" (worst {_gain(worst)})")


def ledger_table(rows: Sequence[LedgerRow]) -> str:
    """The ledger as a Markdown table, newest first, one row per run."""
    head = ["date", "commit", "dvc.lock", "run", *(g.replace("_", " ") for g in GROUPS),
            "fitting vs adaptive rule", "pricing within band", "GRAFT priced", "GRAFT wall",
            "DDTree, best B in hindsight", "GRAFT vs hindsight"]  # fmt: skip
    body = []
    for r in rows:
        f = r.figures
        within, of = f.get("pricing_within"), f.get("pricing_rows")
        pricing = "n/a" if within is None or of is None else f"{within.value:.0f} of {of.value:.0f}"
        speedups = [_speedup(f.get(n)) for n in FIGURES if n.startswith("graft_") and n.endswith("speedup")]
        body.append([r.date, f"`{r.commit[:12]}`", f"`{r.lock_sha256[:12]}`" if r.lock_sha256 else "n/a",
                     f"`{r.run_id[:8]}`" if r.run_id else r.source, *(gain_words(r, g) for g in GROUPS),
                     _gain(f.get("fitting_vs_adaptive_mean")), pricing, *speedups,
                     _gain(f.get("graft_vs_hindsight"))])  # fmt: skip
    return tabulate(body, head, tablefmt="github", disable_numparse=True)
