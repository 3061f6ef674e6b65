"""DVC stage ``margins``: per canonical state, invoke-vs-skip margins by exhaustive suffix search.

Value margins use the exported value systems through the decoder's own NumPy inference
(decoder/scheduler.py), so the offline search is the online planner's code: the final model
(margin_value), and each fold's model on every state (margin_value_by_fold; the held-out one is
margin_value_oof). Oracle margins read the same maxima off the enumerated trajectories.
The search is checked against brute force over full schedule ids on one report at every run.
Writes ``margins.out_dir/`` margins.parquet, margins.csv (plot data) and metrics.json.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from collectors.plots import new_figure
from config.params import Params, resolve
from decoder.planning import BranchSearch, ValueFn, search_margins
from decoder.scheduler import load_value_planner
from decoder.state import state_feature_names
from features.datasets import column, state_matrix
from features.schemas import margins_spec, samples_spec, states_spec
from features.tables import read_table, write_table
from models.margins import brute_force_margins, oracle_margins
from pipeline.cli import run_stage
from pipeline.select_signals import read_signals
from pipeline.tracking import log_figure, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)
_KEYS = ("report_id", "pair_id", "dataset_id", "state_id", "fold_id", "step", "prefix")


def _brute_force_gap(
    predict: ValueFn, z: np.ndarray, states: pa.Table, search: BranchSearch, depth: int
) -> float:
    """Max |exhaustive - brute force| over the first report's states (an always-on self-check)."""
    rows = np.flatnonzero(column(states, "report_id") == column(states, "report_id")[0])
    steps, prefixes = column(states, "step")[rows].astype(int), column(states, "prefix")[rows]
    brute = brute_force_margins(predict, z[rows], steps, [str(p) for p in prefixes], depth)
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
        table = {
            **{k: states.column(k) for k in _KEYS},
            "value_invoke_tok_per_s": search.invoke,
            "value_skip_tok_per_s": search.skip,
            "value_invoke_suffix": search.invoke_suffix,
            "value_skip_suffix": search.skip_suffix,
            "margin_value_tok_per_s": search.margin,
            "margin_value_oof_tok_per_s": oof,
            "margin_value_by_fold_tok_per_s": vm.by_fold.tolist(),
            "oracle_invoke_tok_per_s": oracle.invoke,
            "oracle_skip_tok_per_s": oracle.skip,
            "margin_oracle_tok_per_s": oracle.margin,
        }
        spec = margins_spec(depth)
        write_table(out / "margins.parquet", spec, pa.table(table, schema=spec.schema))
        metrics = {
            "n_states": len(z),
            "brute_force_max_abs_diff": _brute_force_gap(vm.predict, z, states, search, depth),
            "value_vs_oracle": _agreement(search.margin, oracle.margin),
            "value_oof_vs_oracle": _agreement(oof, oracle.margin),
            "share_invoke_value": float(np.mean(search.margin > 0)),
            "share_invoke_oracle": float(np.mean(oracle.margin > 0)),
        }
        rows = zip(steps, search.margin, oracle.margin, strict=True)
        write_csv(
            out / "margins.csv",
            [
                {"state_id": i, "step": int(k), "margin_value": v, "margin_oracle": o}
                for i, (k, v, o) in enumerate(rows)
            ],
        )
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
