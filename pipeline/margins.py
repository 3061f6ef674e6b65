"""DVC stage ``margins``: per canonical state, invoke-vs-skip margins by exhaustive suffix search.

Value margins use the exported value systems through the decoder's own NumPy inference
(decoder/deploy/scheduler.py), so the offline search is the online planner's code: the final model
(margin_value), and each fold's model on every state (margin_value_by_fold; the held-out one is
margin_value_oof). Oracle margins read the same maxima off the enumerated trajectories.
The search is checked against brute force over full schedule ids on one report at every run.
Writes ``margins.out_dir/`` margins.parquet, margins.csv (plot data) and metrics.json.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from collectors.evaluation.plots import new_figure
from config.params import Params, resolve
from decoder.core.state import state_feature_names
from decoder.deploy.planning import BranchSearch, ValueFn, search_margins
from decoder.deploy.scheduler import load_value_planner
from features.datasets import column, state_matrix
from features.schemas import margins_spec, samples_spec, states_spec
from features.signals_file import read_signals
from features.tables import TableSpec, read_table, write_table
from models.margins import OracleMargins, brute_force_margins, oracle_margins
from pipeline.cli import run_stage
from pipeline.tracking import log_figure, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)
_KEYS = ("report_id", "pair_id", "dataset_id", "state_id", "fold_id", "step", "prefix")


def _brute_force_gap(
    predict: ValueFn, z: np.ndarray, states: pa.Table, search: BranchSearch, depth: int
) -> float:
    """Max |exhaustive - brute force| over the first report's states (an always-on self-check)."""
    first = (
        pl.from_arrow(states.select(["report_id", "step", "prefix"]))
        .with_row_index("row")
        .filter(pl.col("report_id") == pl.col("report_id").first())
    )
    rows = first["row"].to_numpy()
    steps, prefixes = first["step"].to_numpy().astype(int), first["prefix"].to_list()
    brute = brute_force_margins(predict, z[rows], steps, prefixes, depth)
    return float(
        max(
            np.max(np.abs(brute.invoke - search.invoke[rows])), np.max(np.abs(brute.skip - search.skip[rows]))
        )
    )


def _agreement(a: np.ndarray, b: np.ndarray) -> dict:
    return {
        "sign_agreement": float(np.mean((a > 0) == (b > 0))),
        "pearson": float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan"),
        "mae_tok_per_s": float(np.mean(np.abs(a - b))),
    }


@dataclass(frozen=True)
class ValueMargins:
    search: BranchSearch  # final value system
    by_fold: np.ndarray  # (n_states, n_folds): margin from the model trained without fold f
    predict: ValueFn  # final value system, original units


def value_margins(params: Params, z: np.ndarray, steps: np.ndarray, n_folds: int) -> ValueMargins:
    """Exhaustive-search margins of the final and every fold value system, via the decoder's loader."""
    depth, fit_dir = params.tree.depth, resolve(params.fit_value.out_dir)
    final = load_value_planner(fit_dir / "value", depth, params.tree.width)
    by_fold = [
        search_margins(
            load_value_planner(fit_dir / "folds" / f"fold{f}", depth).predict, z, steps, depth
        ).margin
        for f in range(n_folds)
    ]
    return ValueMargins(
        search_margins(final.predict, z, steps, depth), np.column_stack(by_fold), final.predict
    )


def margins_table(
    states: pa.Table,
    search: BranchSearch,
    oof: np.ndarray,
    by_fold: np.ndarray,
    oracle: OracleMargins,
    spec: TableSpec,
) -> pa.Table:
    """The margins table: the states' keys (same rows, same order) and each state's margins."""
    n_folds = by_fold.shape[1]
    table = pl.from_arrow(states.select(list(_KEYS))).with_columns(
        pl.Series("value_invoke_tok_per_s", search.invoke, pl.Float64),
        pl.Series("value_skip_tok_per_s", search.skip, pl.Float64),
        pl.Series("value_invoke_suffix", search.invoke_suffix, pl.String),
        pl.Series("value_skip_suffix", search.skip_suffix, pl.String),
        pl.Series("margin_value_tok_per_s", search.margin, pl.Float64),
        pl.Series("margin_value_oof_tok_per_s", oof, pl.Float64),
        pl.Series("margin_value_by_fold_tok_per_s", by_fold, pl.Array(pl.Float64, n_folds)).arr.to_list(),
        pl.Series("oracle_invoke_tok_per_s", oracle.invoke, pl.Float64),
        pl.Series("oracle_skip_tok_per_s", oracle.skip, pl.Float64),
        pl.Series("margin_oracle_tok_per_s", oracle.margin, pl.Float64),
    )
    return table.select(spec.names).to_arrow().cast(spec.schema)


def plot_rows(steps: np.ndarray, value: np.ndarray, oracle: np.ndarray) -> list[dict]:
    """margins.csv: one row per state (state_id = row index), its step and both margins."""
    frame = pl.DataFrame(
        {"step": pl.Series(steps, dtype=pl.Int64), "margin_value": value, "margin_oracle": oracle}
    )
    return frame.select(pl.int_range(pl.len()).alias("state_id"), pl.all()).to_dicts()


def main(params: Params) -> dict:
    depth = params.tree.depth
    src, out = resolve(params.canonicalize.out_dir), resolve(params.margins.out_dir)
    states = read_table(src / "states.parquet", states_spec(depth))
    samples = read_table(src / "samples.parquet", samples_spec(depth))
    z = state_matrix(states, state_feature_names(depth, read_signals(params)))
    steps, folds = column(states, "step").astype(int), column(states, "fold_id").astype(int)
    with stage_run("margins", params):
        vm = value_margins(params, z, steps, folds.max() + 1)
        search, oof = vm.search, vm.by_fold[np.arange(len(z)), folds]
        sample_cols = [column(samples, c) for c in ("state_id", "is_invoke", "throughput_tok_per_s")]
        oracle = oracle_margins(*sample_cols, len(z))
        spec = margins_spec(depth)
        write_table(
            out / "margins.parquet", spec, margins_table(states, search, oof, vm.by_fold, oracle, spec)
        )
        metrics = {
            "n_states": len(z),
            "brute_force_max_abs_diff": _brute_force_gap(vm.predict, z, states, search, depth),
            "value_vs_oracle": _agreement(search.margin, oracle.margin),
            "value_oof_vs_oracle": _agreement(oof, oracle.margin),
            "share_invoke_value": float(np.mean(search.margin > 0)),
            "share_invoke_oracle": float(np.mean(oracle.margin > 0)),
        }
        write_csv(out / "margins.csv", plot_rows(steps, search.margin, oracle.margin))
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        _plot(search.margin, oof, oracle.margin)
    log.info("margins: value vs oracle sign agreement %.3f", metrics["value_vs_oracle"]["sign_agreement"])
    return metrics


def _plot(value: np.ndarray, oof: np.ndarray, oracle: np.ndarray) -> None:
    fig, ax = new_figure(5, 5)
    ax.scatter(oracle, value, s=4, alpha=0.6, label="final value system")
    ax.scatter(oracle, oof, s=4, alpha=0.6, label="out-of-fold value system")
    lo, hi = float(min(oracle.min(), value.min())), float(max(oracle.max(), value.max()))
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel("oracle margin (tok/s, enumerated trajectories)")
    ax.set_ylabel("value-system margin (tok/s, exhaustive suffix search)")
    ax.legend(fontsize=7)
    log_figure(fig, "margins_value_vs_oracle.png")


if __name__ == "__main__":
    run_stage("margins", main)
