"""Grouped out-of-fold evaluation of TDES on one pair (folds by prompt, models/edge_metrics.py).

For each fold the scorer is fitted on the other folds' edges (models/edge_scorer_fit.py) and
scores the held-out fold: edge AUC of z = log q + s f and of f alone against the unary baseline
log q, and each held-out round replayed at every budget of ``eval_budgets``, by marginals and with
the fold's exported scorer (A and the mismatch rate), overall and per dataset.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from config.params import EdgesParams
from models.edge_metrics import Replay, edge_auc, prompt_folds, replay_round, summarize
from models.edge_scorer_fit import edge_data, export_scorer, fit_tdes


def cell_budget_of(cfg: EdgesParams) -> int:
    """The budget of the per-dataset cells: edges.budget if replayed, else the largest replayed."""
    return cfg.budget if cfg.budget in cfg.eval_budgets else max(cfg.eval_budgets)


def fold_column(frame: pl.DataFrame, folds: dict[tuple[int, str], int]) -> np.ndarray:
    keys = zip(frame["prompt_id"].to_list(), frame["dataset_id"].to_list(), strict=True)
    return np.array([folds[key] for key in keys], dtype=np.int64)


def round_arrays(row: dict) -> tuple[int, np.ndarray, np.ndarray, list[int]]:
    """(root, ids (K, m), logps (K, m), greedy) of one ``edge_rounds`` row."""
    shape = (row["k"], row["m"])
    ids = np.asarray(row["cand_ids"], dtype=np.int64).reshape(shape)
    return (
        row["root_token"],
        ids,
        np.asarray(row["cand_logps"], dtype=np.float64).reshape(shape),
        row["greedy_ids"],
    )


def _replay_summary(replays: list[Replay]) -> dict:
    s = summarize(replays)
    return {"mean_accepted": s.mean_accepted, "mismatch_rate": s.mismatch_rate, "n_rounds": s.n_rounds}


def cross_fit(edges: pl.DataFrame, rounds: pl.DataFrame, embeddings: torch.Tensor, cfg: EdgesParams) -> dict:
    """Out-of-fold metrics of one pair; see the module docstring."""
    keys = list(zip(rounds["prompt_id"].to_list(), rounds["dataset_id"].to_list(), strict=True))
    folds = prompt_folds(keys, cfg.n_folds)
    edge_fold, round_fold = fold_column(edges, folds), fold_column(rounds, folds)
    k = int(rounds["k"].max())
    z_oof, f_oof = np.full(edges.height, np.nan), np.full(edges.height, np.nan)
    replays: dict[tuple[str, int, str], list[Replay]] = {}
    for fold in range(max(folds.values()) + 1):
        fit = fit_tdes(
            edge_data(edges.filter(pl.Series(edge_fold != fold))), embeddings, k, cfg, cfg.seed + fold
        )
        held = np.flatnonzero(edge_fold == fold)
        part = edges[held]
        with torch.no_grad():
            f = fit.net(
                *(
                    torch.from_numpy(part[c].to_numpy().astype(np.int64))
                    for c in ("parent_token", "child_token", "depth")
                )
            )
        f_oof[held] = f.double().numpy()
        z_oof[held] = part["logq"].to_numpy() + fit.net.scale.item() * f_oof[held]
        scorer = export_scorer(fit.net)
        for row in rounds.filter(pl.Series(round_fold == fold)).iter_rows(named=True):
            root, ids, logps, greedy = round_arrays(row)
            for b in cfg.eval_budgets:
                for name, sc in (("marginal", None), ("tdes", scorer)):
                    got = replay_round(root, ids, logps, greedy, b, sc)
                    for cell in ("all", row["dataset_id"]):
                        replays.setdefault((name, b, cell), []).append(got)
    labels = edges["is_target"].to_numpy()
    by_budget = {
        str(b): {name: _replay_summary(replays[(name, b, "all")]) for name in ("marginal", "tdes")}
        for b in cfg.eval_budgets
    }
    cell_budget = cell_budget_of(cfg)
    cells = {
        d: {name: _replay_summary(replays[(name, cell_budget, d)]) for name in ("marginal", "tdes")}
        for d in sorted(set(rounds["dataset_id"].to_list()))
    }
    return {
        "n_edges": edges.height,
        "n_positive": int(labels.sum()),
        "n_rounds": rounds.height,
        "n_folds": max(folds.values()) + 1,
        "auc_unary": edge_auc(edges["logq"].to_numpy(), labels),
        "auc_tdes": edge_auc(z_oof, labels),
        "auc_f": edge_auc(f_oof, labels),
        "cell_budget": cell_budget,
        "budgets": by_budget,
        "cells": cells,
    }
