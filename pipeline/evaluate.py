"""DVC stage ``evaluate``: the paper's main table and ablations on held-back prompts.

Per (pair, dataset) cell, the primary metric is the priced speedup over autoregressive decoding:
All-Small, All-Mid, 10101, the best fixed schedule in hindsight, the value planner and the exported
student, every one replayed exactly on ``evaluate.prompts_per_cell`` prompts and priced with the
pair's latency profile (collectors/evaluation/priced_eval.py), with a bootstrap 95% interval over
prompts. The ``deployed`` row of each pair is what its deployment bundle says (the ``deploy``
stage's pair check, loaded with decoder.load_deployment and checked against the tree this stage
decodes with; collectors/evaluation/deployed.py): this stage decides nothing itself. The replay
runs in ``evaluate.workers`` processes, cells sharing a target computing its work once
(collectors/evaluation/priced_tasks.py). Every threshold the pair check tried is replayed too: the
check's choice seen on the held-back prompts (``threshold_transfer``). Held-out pairs (never
collected) and tasks (never fitted) are marked. Ablations under the fixed schedule (full, no
extended grafting, overwrite grafting, sequential cascade) are decoded for real on the first
``evaluate.ablation.prompts_per_cell`` prompts, with the mechanism statistics and the lossless gate.
That the prices agree with the clock is the next stage's check (pipeline/wall_check.py). Writes
under evaluate.out_dir: results.json, table.md, ablations.md, metrics.json and plots (PNG + CSV
for `dvc plots`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tqdm import tqdm

from collectors.collect.plan import load_registered_pair
from collectors.evaluation.cell import WARM_AGAIN_TOKENS, WARMUP_TOKENS, evaluate_cell
from collectors.evaluation.deployed import (
    deployed_checks,
    exported_students,
    learned_policies,
    pair_check_of,
)
from collectors.evaluation.eval_report import (
    ablation_table,
    calls_plot,
    cell_rows,
    main_table,
    plot_rows,
    speedup_plot,
    summary_metrics,
)
from collectors.evaluation.priced_eval import ENDPOINTS, FIXED, PricedCell, fastest, pooled_speedups
from collectors.evaluation.priced_tasks import cell_inputs, decode_config, priced_cells
from config.params import Params, resolve
from decoder.config import Grafting, TreeConfig
from decoder.deployment import Deployment
from decoder.measure import Method
from decoder.scheduler import LearnedScheduler
from models.offline import THRESHOLD_OFFSETS
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_figure, log_files, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)

FIXED_METHODS = {**FIXED, "10101": "10101"}


def evaluate_rows(
    params: Params,
    cells: list[tuple[str, str]],
    policies: dict,
    deployments: Mapping[str, Deployment],
    students: Mapping[str, LearnedScheduler],
) -> tuple[list[dict], dict[tuple[str, str], PricedCell]]:
    """Every cell's priced rows (in ``evaluate.workers`` processes) and the priced cells. Every one
    of ``students`` is replayed on every cell (the held-back check of the pair check's choice);
    only the rows of ``policies``, the fixed methods and ``deployed`` are returned, the last a copy
    of the row of the method its pair's bundle deploys (``deployments``), with ``deployed_as``."""
    cfg = params.evaluate
    extra = {n: p for n, p in students.items() if n not in policies}
    with tqdm(total=len(cells) * cfg.prompts_per_cell, desc="evaluate (priced replay)", unit="prompt") as bar:
        priced_by_cell = priced_cells(params, cells, {**policies, **extra}, FIXED_METHODS, bar.update)
    rows = []
    for pair_id, dataset in cells:
        priced = priced_by_cell[(pair_id, dataset)]
        log.info("%s %s: best fixed schedule in hindsight %s", pair_id, dataset, priced.best_fixed)
        deploys = deployments[pair_id].decision["deploys"]
        for row in cell_rows(priced, cfg.bootstrap, deploys, drop=tuple(extra)):
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
            rows.append(row)
    return rows, priced_by_cell


def threshold_transfer(
    priced_by_cell: Mapping[tuple[str, str], PricedCell], checks: Mapping[str, dict], fitting: Sequence[str]
) -> dict[str, dict]:
    """The pair check's choice seen on the held-back prompts: per pair, the endpoints and the student
    at every threshold the check tried, pooled over the pair's cells of the ``fitting`` datasets
    (collectors.evaluation.priced_eval.pooled_speedups), with what the check chose on the calibration prompts
    (``chosen``) and the fastest threshold here (``held_back_best``; the first tried among equals)."""
    out = {}
    for pair_id, check in checks.items():
        speedup = pooled_speedups([priced_by_cell[(pair_id, d)] for d in fitting], tuple(check["speedup"]))
        learned = [m for m in speedup if m not in ENDPOINTS]
        out[pair_id] = {
            "chosen": check["deploys"],
            "held_back_best": fastest(speedup, learned),
            "speedup": speedup,
        }
    return out


def ablation_methods(params: Params, tree: TreeConfig) -> list[Method]:
    schedule = params.evaluate.ablation.schedule
    return [
        Method("full", schedule, tree),
        Method("no-eg", schedule, replace(tree, extended_grafting=False)),
        Method("overwrite", schedule, replace(tree, grafting=Grafting.OVERWRITE)),
        Method("cascade", schedule, replace(tree, sequential=True)),
    ]


def _ablation_cells(params: Params, cells: list[tuple[str, str]]) -> list[dict]:
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


def main(params: Params) -> dict:
    apply_runtime(params)
    cfg = params.evaluate
    unknown = [p for p in (*cfg.pairs, *cfg.ablation.pairs) if p not in params.pairs]
    if unknown:
        raise ValueError(f"evaluate: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}")
    out = resolve(cfg.out_dir)
    depth = params.tree.depth
    with stage_run("evaluate", params):
        students = exported_students(params, THRESHOLD_OFFSETS)
        policies = learned_policies(params, students)
        deployments = deployed_checks(params, {p: decode_config(params, p).tree for p in cfg.pairs}, students)
        checks = {p: pair_check_of(d) for p, d in deployments.items()}
        cells = [(p, d) for p in cfg.pairs for d in cfg.datasets]
        rows, priced_by_cell = evaluate_rows(params, cells, policies, deployments, students)
        fitting = [d for d in cfg.datasets if d not in cfg.held_out_datasets]
        transfer = threshold_transfer(priced_by_cell, checks, fitting)
        ablations = _ablation_cells(
            params, [(p, d) for p in cfg.ablation.pairs for d in cfg.ablation.datasets]
        )
        metrics = {**summary_metrics(rows), "pair_check": checks, "threshold_transfer": transfer}
        table, abl = main_table(rows), ablation_table(ablations)
        write_json(out / "results.json", {"main": rows, "ablations": ablations, "pair_check": checks})
        write_json(out / "metrics.json", metrics)
        (out / "table.md").write_text(table + "\n")
        (out / "ablations.md").write_text(abl + "\n")
        speed, calls = plot_rows(rows, depth)
        write_csv(out / "plots" / "speedup.csv", speed)
        write_csv(out / "plots" / "calls_per_step.csv", calls)
        log_figure(speedup_plot(rows, out / "speedup.png"), "speedup.png")
        log_figure(calls_plot(rows, depth, out / "calls_per_step.png"), "calls_per_step.png")
        log_metrics(metrics)
        log_files([out / name for name in ("table.md", "ablations.md", "results.json")])
    print(table)
    print()
    print(abl)
    return metrics


if __name__ == "__main__":
    run_stage("evaluate", main)
