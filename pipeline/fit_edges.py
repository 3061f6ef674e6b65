"""DVC stage ``fit_edges``: GRAFT's edge scorer (TDES) per pair, its out-of-fold metrics, its export.

For each pair of edges.pairs, on the edges and rounds collect_edges wrote: grouped out-of-fold
metrics (models/edge_cv.py: folds by prompt; edge AUC of TDES and of the unary log q baseline, A
and the parent-child mismatch rate at every budget of edges.eval_budgets, by marginals and with
TDES, per dataset at edges.budget), then one fit on all of the pair's edges, exported with its
manifest (decoder/graft/edge_scorer.py) to ``edges.fit_dir/scorers/<pair>/``. The target's token embeddings
(frozen) come from the pair's target in the zoo.

Writes ``edges.fit_dir``: ``scorers/<pair>/edge_scorer.{json,safetensors}``, ``edges.md`` (the table the
README can quote), ``curves.csv`` (training loss per step of the final fits) and ``metrics.json``.
"""

from __future__ import annotations

import logging
import math
import time

import polars as pl
from tabulate import tabulate

from collectors.collect.plan import load_registered_pair
from config.params import Params, resolve
from decoder.graft.edge_scorer import save_edge_scorer
from features.edge_schemas import EDGE_ROUNDS, EDGES
from features.tables import read_table
from models.edge_cv import cell_budget_of, cross_fit
from models.edge_scorer_fit import edge_data, export_scorer, fit_tdes
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)


def validate(params: Params) -> None:
    cfg = params.edges
    for name in ("proj", "depth_dim", "hidden", "epochs", "n_folds"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"edges.{name} must be positive, got {getattr(cfg, name)}")
    weights = (cfg.lambda_kl, cfg.lambda_pair, cfg.lambda_bce)
    if min(weights) < 0 or sum(weights) <= 0 or cfg.w1 < 0 or cfg.lr <= 0:
        raise ValueError("edges.lambda_* and edges.w1 must be >= 0 (lambdas not all 0), edges.lr > 0")
    if not cfg.eval_budgets or min(cfg.eval_budgets) <= 0:
        raise ValueError(f"edges.eval_budgets must be positive budgets, got {list(cfg.eval_budgets)}")


def fit_pair(params: Params, pair_id: str, edges: pl.DataFrame, rounds: pl.DataFrame) -> tuple[dict, list]:
    """OOF metrics, then the final fit exported; returns (metrics, curve rows)."""
    cfg = params.edges
    t0 = time.perf_counter()
    pair = load_registered_pair(params, pair_id)
    embeddings = pair.target.get_input_embeddings().weight.detach()[: pair.vocab_size]
    metrics = cross_fit(edges, rounds, embeddings, cfg)
    k = int(rounds["k"].max())
    final = fit_tdes(edge_data(edges), embeddings, k, cfg, cfg.seed)
    drafter_id = rounds["drafter_id"][0]
    save_edge_scorer(
        resolve(cfg.fit_dir) / "scorers" / pair_id, export_scorer(final.net), pair_id, drafter_id
    )
    metrics.update(drafter_id=drafter_id, scale=final.net.scale.item(), final_loss=final.losses[-1])
    metrics["seconds"] = time.perf_counter() - t0
    curve = [{"pair_id": pair_id, "step": i, "train_loss": v} for i, v in enumerate(final.losses)]
    return metrics, curve


def markdown(per_pair: dict[str, dict]) -> str:
    head = ["pair", "B", "A marginals", "A TDES", "mismatch marginals", "mismatch TDES", "AUC unary",
            "AUC TDES"]  # fmt: skip
    body = [
        [pair_id, str(b), f"{row['marginal']['mean_accepted']:.3f}", f"{row['tdes']['mean_accepted']:.3f}",
         f"{row['marginal']['mismatch_rate']:.3f}", f"{row['tdes']['mismatch_rate']:.3f}",
         f"{m['auc_unary']:.3f}", f"{m['auc_tdes']:.3f}"]
        for pair_id, m in per_pair.items()
        for b, row in m["budgets"].items()
    ]  # fmt: skip
    return tabulate(body, head, tablefmt="github", disable_numparse=True) + "\n"


def summary(per_pair: dict[str, dict]) -> dict:
    """Cells (pair x dataset at the cell budget) where TDES raises A, and mean gains."""
    cells = [c for m in per_pair.values() for c in m["cells"].values()]
    raised = sum(c["tdes"]["mean_accepted"] > c["marginal"]["mean_accepted"] for c in cells)
    gains = [m["budgets"][str(m["cell_budget"])] for m in per_pair.values()]
    return {
        "n_cells": len(cells),
        "cells_raised_fraction": raised / len(cells) if cells else math.nan,
        "mean_accepted_gain": sum(g["tdes"]["mean_accepted"] - g["marginal"]["mean_accepted"] for g in gains)
        / len(gains),
    }


def main(params: Params) -> dict:
    validate(params)
    apply_runtime(params)  # one torch thread: small full-batch steps are ~10x slower on two contended cores
    cfg = params.edges
    src, out = resolve(cfg.collect_dir), resolve(cfg.fit_dir)
    edges = pl.from_arrow(read_table(src / "edges.parquet", EDGES))
    rounds = pl.from_arrow(read_table(src / "edge_rounds.parquet", EDGE_ROUNDS))
    with stage_run("fit_edges", params):
        per_pair, curves = {}, []
        for pair_id in cfg.pairs:
            pair_edges = edges.filter(pl.col("pair_id") == pair_id)
            pair_rounds = rounds.filter(pl.col("pair_id") == pair_id)
            if pair_rounds.height == 0:
                raise ValueError(f"{src / 'edge_rounds.parquet'}: no rounds of pair {pair_id!r}")
            per_pair[pair_id], curve = fit_pair(params, pair_id, pair_edges, pair_rounds)
            curves += curve
            log.info("%s: %s", pair_id, {k: v for k, v in per_pair[pair_id].items() if k != "cells"})
        metrics = {**summary(per_pair), "cell_budget": cell_budget_of(cfg), "pairs": per_pair}
        table = markdown(per_pair)
        (out / "edges.md").write_text(table)
        write_csv(out / "curves.csv", curves)
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
    print(table)
    return metrics


if __name__ == "__main__":
    run_stage("fit_edges", main)
