"""Fake outputs of a pipeline run, as `make results` reads them: the stages' metrics and tables.

:func:`write_artifacts` puts every file pipeline/readme.py reads under ``root`` at the params'
out_dirs (tables as one-cell placeholders, metrics as the small dicts below).
"""

from __future__ import annotations

import json
from pathlib import Path

from config.params import Params


def deployed(mean: float, worst: float, n: int, best: float | None = None) -> dict:
    stats = {"student_gain_mean": mean, "student_gain_best": 1.5, "student_gain_worst": worst, "n_cells": n}
    return stats if best is None else {**stats, "student_at_least_best_fixed": best}


def graft_cell(pair: str, dataset: str, graft: float, hindsight: float, learned: float = 1.0) -> dict:
    row = {"mean_accepted": 1.5, "mismatch_rate": 0.2, "tree_size": 8.0, "budget": 8}
    rows = {"graft": {**row, "speedup": graft}, "hindsight": {**row, "speedup": hindsight},
            "full": {**row, "speedup": learned}}  # fmt: skip
    return {"pair_id": pair, "dataset_id": dataset, "rows": rows}


WALL = {
    "summary": {
        "stage": {"rows": 20, "within": 14, "outside": 2, "unresolved": 4, "min": 0.79, "median": 1.02,
                  "max": 1.28},
        "beside": {"rows": 20, "within": 17, "outside": 0, "unresolved": 3, "min": 0.88, "median": 0.99,
                   "max": 1.12},
    },
    "profile_drift": {"zoo-l": {"verify": 0.8, "mid": 0.91}},
}  # fmt: skip

GRAFT = {"n_cells": 12, "mean_speedup": {"full": 1.63, "hindsight": 1.51},
         "mean_wall_speedup": {"full": 1.72}, "full_graft_at_least_hindsight": 11 / 12}  # fmt: skip

EVALUATE = {"deployed.priced_speedup.fitting": deployed(1.095, 1.0, 25, 0.84)}


def write_artifacts(root: Path, params: Params, ev_metrics: dict | None = None) -> None:
    """Every input of `make results` under ``root``, the evaluate metrics ``ev_metrics``."""

    def put(out_dir: str, name: str, content: object) -> None:
        path = root / out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))

    for name in ("table.md", "ablations.md"):
        put(params.evaluate.out_dir, name, f"| {name} |")
    put(params.evaluate.out_dir, "metrics.json", EVALUATE if ev_metrics is None else ev_metrics)
    put(params.wall_check.out_dir, "wall.md", "| wall.md |")
    put(params.wall_check.out_dir, "metrics.json", WALL)
    put(params.evaluate.out_dir, "results.json", {"main": [{"pair_id": p} for p in params.evaluate.pairs]})
    put(params.budget.out_dir, "budgets.md", "| budgets |")
    put(params.distill.out_dir, "offline.md", "| offline |")
    put(params.collect.out_dir, "summary.md", "| summary |")
    put(params.collect.out_dir, "metrics.json", {})
    budgets = {"plain": {"budget": 9}, "tdes": {"budget": 10}}
    graft = {**GRAFT, "pairs": {"zoo-m": {"learned_budget": budgets}},
             "graft_at_least_hindsight": 0.0, "graft_rule_at_least_hindsight": 0.5,
             "learned_at_least_saba_on_mean": True, "full_graft_at_least_saba_graft_on_mean": True,
             "tdes_raises_a": 0.9, "tdes_keeps_or_raises_a": 0.9, "tdes_raises_a_at_learned_budget": 0.9,
             "max_overhead_ms": 0.17}  # fmt: skip
    put(params.graft_eval.out_dir, "metrics.json", graft)
    put(params.graft_eval.out_dir, "cells.json", [graft_cell("zoo-m", "alpaca", 1.2, 1.1)])
    put(params.graft_eval.out_dir, "graft.md", "| graft |")
