"""DVC stage ``evaluate_fixed``: what evaluation measures that no trained scheduler changes.

Per (pair, dataset) cell of evaluate.pairs x evaluate.datasets, on the ``evaluate.prompts_per_cell``
held-back prompts: the target's greedy continuations, autoregressive decoding's priced time, and
All-Small, All-Mid, 10101 and the best fixed schedule in hindsight, all 2^D schedules replayed and
priced with the pair's latency profile (collectors/evaluation/priced_eval.py, in
``evaluate.workers`` processes). And the ablations under the fixed schedule, decoded for real (full,
no extended grafting, overwrite grafting, sequential cascade) with the lossless gate. Its inputs are
the models, profiles, budgets and prompts, not the scheduler: a ``dvc exp run -S distill.x=...``
does not rerun it, and ``evaluate`` then replays only the learned policies from its stored
continuations. The same for the pair check's calibration cells (All-Small and All-Mid), which
``deploy`` completes with the students. Writes ``<evaluate.out_dir>/fixed/fixed.json`` and
``calibration.json``, each with its target rows in a ``.rows.parquet`` beside it
(collectors/evaluation/fixed_cells.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from tqdm import tqdm

from collectors.collect.plan import load_registered_pair
from collectors.evaluation.cell import WARM_AGAIN_TOKENS, WARMUP_TOKENS, evaluate_cell
from collectors.evaluation.deployed import check_registered
from collectors.evaluation.fixed_cells import FIXED_METHODS, calibration_path, fixed_path, write_fixed
from collectors.evaluation.priced_eval import ENDPOINTS, FIXED
from collectors.evaluation.priced_tasks import (
    BUDGET,
    calibration_range,
    cell_inputs,
    decode_config,
    priced_cells,
)
from config.params import Params, resolve
from decoder.core.config import Grafting, TreeConfig
from decoder.measure import Method
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)


def ablation_methods(params: Params, tree: TreeConfig) -> list[Method]:
    schedule = params.evaluate.ablation.schedule
    return [
        Method("full", schedule, tree),
        Method("no-eg", schedule, replace(tree, extended_grafting=False)),
        Method("overwrite", schedule, replace(tree, grafting=Grafting.OVERWRITE)),
        Method("cascade", schedule, replace(tree, sequential=True)),
    ]


def ablation_rows(params: Params, cells: list[tuple[str, str]]) -> list[dict]:
    """The ablation methods decoded for real on each cell's first ablation prompts."""
    cfg = params.evaluate
    rows, warm_pair = [], None
    for pair_id, dataset in tqdm(cells, desc="ablations", unit="cell"):
        pair = load_registered_pair(params, pair_id)
        warmup = WARM_AGAIN_TOKENS if pair_id == warm_pair else WARMUP_TOKENS
        warm_pair = pair_id
        questions, prompts, profile, runtime = cell_inputs(
            params, pair_id, dataset, pair, cfg.ablation.prompts_per_cell
        )
        config = decode_config(params, pair_id)
        methods = ablation_methods(params, config.tree)
        cell = evaluate_cell(pair, questions, prompts, methods, config, runtime, profile, warmup)
        for row in cell.rows:
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
        rows += cell.rows
    return rows


def calibration_cells(params: Params) -> dict:
    """The endpoints and the pair's budget-stage schedule priced on every pair check cell (each
    evaluated pair x fitting dataset, on the calibration prompts:
    collectors.evaluation.priced_tasks.calibration_range), with the continuations; ``deploy`` adds
    the students to them."""
    cfg = params.evaluate
    cells = [(p, d) for p in cfg.pairs for d in cfg.datasets if d not in cfg.held_out_datasets]
    prompts = calibration_range(
        params.collect.prompt_start, params.collect.prompts_per_report, cfg.prompt_start
    )
    endpoints = {**{m: FIXED[m] for m in ENDPOINTS}, BUDGET: BUDGET}  # the pair check's fixed options
    with tqdm(total=len(cells) * prompts[1], desc="evaluate_fixed (calibration)", unit="prompt") as bar:
        return priced_cells(params, cells, {}, endpoints, bar.update, prompts, hindsight=False)


def main(params: Params) -> dict:
    apply_runtime(params)
    cfg = params.evaluate
    check_registered(params, [*cfg.pairs, *cfg.ablation.pairs], "evaluate")
    cells = [(p, d) for p in cfg.pairs for d in cfg.datasets]
    with stage_run("evaluate_fixed", params):
        total = len(cells) * cfg.prompts_per_cell
        with tqdm(total=total, desc="evaluate_fixed (priced replay)", unit="prompt") as bar:
            fixed = priced_cells(params, cells, {}, FIXED_METHODS, bar.update)
        calibration = calibration_cells(params)
        ablations = ablation_rows(params, [(p, d) for p in cfg.ablation.pairs for d in cfg.ablation.datasets])
        path = write_fixed(fixed_path(resolve(cfg.out_dir)), fixed, ablations)
        write_fixed(calibration_path(resolve(cfg.out_dir)), calibration, [])
        metrics = {
            "cells": len(fixed),
            "prompts": sum(len(c.tokens) for c in fixed.values()),
            "best_fixed_speedup": {  # priced, over AR
                f"{p}/{d}": float(c.ar_ms.sum() / c.methods["best-fixed"].ms.sum())
                for (p, d), c in fixed.items()
            },
        }
        log_metrics(metrics)
    log.info("wrote %s", path)
    return metrics


if __name__ == "__main__":
    run_stage("evaluate_fixed", main)
