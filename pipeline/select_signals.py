"""DVC stage ``select_signals``: rank every k-of-10 subset of tree signals by grouped OOF NMAE.

Reads the canonicalize tables; writes ``select_signals.out_dir/`` signals.json (the chosen ordered
subset for the final models, plus ``by_fold``: per split of features/folds.py and outer fold, the
subset chosen without that fold, which the fold models use), ranking.csv (every evaluated subset
including the size-0 baseline, best first), nmae_by_size.csv and metrics.json.
One MLflow run ``select_signals`` with the ranking CSV and plots as artifacts.
"""

from __future__ import annotations

import logging

import mlflow
import numpy as np

from collectors.evaluation.plots import new_figure
from config.params import Params, resolve
from decoder.core.state import SIGNAL_NAMES, state_feature_names
from decoder.deploy.planning import value_inputs
from features.datasets import column, state_matrix
from features.folds import fold_rows, splits_of
from features.schemas import samples_spec, states_spec
from features.selection import (
    NestedSelection,
    SelectionData,
    SubsetScore,
    choose,
    nested_choice,
    rank_subsets,
    with_folds,
)
from features.tables import read_table
from pipeline.cli import run_stage
from pipeline.tracking import log_figure, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)
# The public reference student's signals (design note, section 5.3), ranked for comparison.
PUBLIC_SUBSET = (
    "frontier_mean_depth",
    "frontier_leaf_ratio",
    "preview_mean_score",
    "preview_overlap_ratio",
    "preview_history_share",
    "preview_collapse_debt",
)


def load_selection_data(params: Params) -> SelectionData:
    depth = params.tree.depth
    src = resolve(params.canonicalize.out_dir)
    states = read_table(src / "states.parquet", states_spec(depth))
    samples = read_table(src / "samples.parquet", samples_spec(depth))
    sid = column(samples, "state_id").astype(np.int64)
    base = state_matrix(states, state_feature_names(depth, ()))[sid]
    base = value_inputs(base, [str(s) for s in column(samples, "suffix")], depth)
    targets = np.column_stack(
        [column(samples, "mean_accepted_length"), np.log(column(samples, "round_latency_ms"))]
    ).astype(np.float64)
    return SelectionData(
        base,
        state_matrix(states, SIGNAL_NAMES)[sid],
        column(samples, "is_invoke").astype(np.float64),
        targets,
        column(samples, "fold_id").astype(np.int64),
    )


def _nested(params: Params, data: SelectionData) -> dict[str, NestedSelection]:
    cfg, depth = params.select_signals, params.tree.depth
    samples = read_table(resolve(params.canonicalize.out_dir) / "samples.parquet", samples_spec(depth))
    splits = splits_of(samples.column("pair_id").to_pylist())
    folds = {split: fold_rows(samples, split) for split in splits}
    return {
        split: nested_choice(with_folds(data, f), SIGNAL_NAMES, cfg.n_signals, cfg.ridge_alpha)
        for split, f in folds.items()
        if len(np.unique(f)) >= 3  # two inner folds at least; a split of 2 pairs has no nested story
    }


def main(params: Params) -> dict:
    cfg = params.select_signals
    out = resolve(cfg.out_dir)
    sizes = sorted({0, *cfg.sizes, cfg.n_signals})  # size 0: the no-tree-signal baseline
    with stage_run("select_signals", params):
        data = load_selection_data(params)
        ranking = rank_subsets(data, SIGNAL_NAMES, sizes, cfg.ridge_alpha)
        chosen = choose(ranking, cfg.n_signals)
        nested = _nested(params, data)
        rows = [_row(i + 1, s) for i, s in enumerate(ranking)]
        write_csv(out / "ranking.csv", rows)
        by_size = [
            {"size": k, "best_nmae": min(s.nmae for s in ranking if len(s.signals) == k)} for k in sizes
        ]
        write_csv(out / "nmae_by_size.csv", by_size)
        by_fold = {split: [list(s.signals) for s in n.by_fold] for split, n in nested.items()}
        write_json(
            out / "signals.json", {"signals": list(chosen.signals), "nmae": chosen.nmae, "by_fold": by_fold}
        )
        public = (
            next(r for r in rows if r["signals"] == "+".join(PUBLIC_SUBSET)) if cfg.n_signals == 6 else None
        )
        metrics = {
            "n_subsets": len(ranking),
            f"n_subsets_size_{cfg.n_signals}": sum(len(s.signals) == cfg.n_signals for s in ranking),
            "chosen_nmae": chosen.nmae,
            "chosen_nmae_accepted": chosen.per_target[0],
            "chosen_nmae_log_latency": chosen.per_target[1],
            "best_nmae_by_size": {str(r["size"]): r["best_nmae"] for r in by_size},
            "size_0_nmae": choose(ranking, 0).nmae,
            "nested": {
                split: {
                    "outer_oof_nmae": n.outer.nmae,
                    "folds_choosing_final_subset": sum(s.signals == chosen.signals for s in n.by_fold),
                    "n_folds": len(n.by_fold),
                }
                for split, n in nested.items()
            },
            **(
                {"public_subset_nmae": public["nmae"], "public_subset_rank": public["rank"]} if public else {}
            ),
        }
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        mlflow.log_artifact(str(out / "ranking.csv"))
        mlflow.log_dict({"signals": list(chosen.signals)}, "signals.json")
        _plot(ranking, cfg.n_signals)
    log.info("chosen signals %s (NMAE %.4f)", chosen.signals, chosen.nmae)
    return metrics


def _row(rank: int, s: SubsetScore) -> dict:
    return {
        "rank": rank,
        "size": len(s.signals),
        "signals": "+".join(s.signals),
        "nmae": s.nmae,
        "nmae_accepted": s.per_target[0],
        "nmae_log_latency": s.per_target[1],
    }


def _plot(ranking: list[SubsetScore], size: int) -> None:
    fig, ax = new_figure(7, 4)
    same = [s.nmae for s in ranking if len(s.signals) == size]
    ax.plot(range(1, len(same) + 1), same, marker=".", lw=0.8)
    ax.set_xlabel(f"rank among the {len(same)} subsets of {size} signals")
    ax.set_ylabel("grouped OOF NMAE (mean over A, log t)")
    ax.set_title("signal subsets by out-of-fold NMAE (lower is better)")
    log_figure(fig, "subset_ranking.png")
    fig, ax = new_figure(7, 4)
    top = [s for s in ranking if len(s.signals) == size][:10]
    counts = [sum(name in s.signals for s in top) for name in SIGNAL_NAMES]
    ax.barh(list(SIGNAL_NAMES), counts)
    ax.set_xlabel(f"appearances in the top {len(top)} subsets of size {size}")
    log_figure(fig, "signal_frequency.png")


if __name__ == "__main__":
    run_stage("select_signals", main)
