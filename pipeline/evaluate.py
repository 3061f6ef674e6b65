"""DVC stage ``evaluate``: the paper's main table and ablations on held-back prompts.

Per (pair, dataset) cell, the primary metric is the priced speedup over autoregressive decoding:
All-Small, All-Mid, 10101, the best fixed schedule in hindsight, the value planner and the exported
student, every one replayed exactly on ``evaluate.prompts_per_cell`` prompts and priced with the
pair's latency profile (collectors/evaluation/priced_eval.py), with a bootstrap 95% interval over
prompts. The fixed schedules' part of each cell, the target's continuations and the ablations come
from the ``evaluate_fixed`` stage, which does not depend on the scheduler
(collectors/evaluation/fixed_cells.py); this stage replays the learned policies from the stored
continuations and merges them in, which equals pricing everything in one pass. The ``deployed``
row of each pair is what its deployment bundle says (the ``deploy`` stage's pair check, loaded with
decoder.load_deployment and checked against the tree this stage decodes with;
collectors/evaluation/deployed.py): this stage decides nothing itself. The replay runs in
``evaluate.workers`` processes, cells sharing a target computing its work once
(collectors/evaluation/priced_tasks.py). Every threshold the pair check tried is replayed too: the
check's choice seen on the held-back prompts (``threshold_transfer``). Held-out pairs (never
collected) and tasks (never fitted) are marked. That the prices agree with the clock is the next
stage's check (pipeline/wall_check.py). Writes under evaluate.out_dir: results.json, table.md,
ablations.md, metrics.json and plots (PNG + CSV for `dvc plots`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from tqdm import tqdm

from collectors.evaluation.deployed import check_registered, load_evaluated, pair_check_of
from collectors.evaluation.eval_report import (
    ablation_table,
    calls_plot,
    cell_groups,
    cell_rows,
    main_table,
    plot_rows,
    speedup_plot,
    summary_metrics,
)
from collectors.evaluation.fixed_cells import fixed_path, read_fixed
from collectors.evaluation.headline import deployed_headline
from collectors.evaluation.priced_eval import ENDPOINTS, PricedCell, fastest, pooled_speedups
from collectors.evaluation.priced_tasks import BUDGET, priced_cells
from config.params import Params, resolve
from decoder.core.adaptive import GRID, AdaptiveTiers
from decoder.deploy.deployment import Deployment
from decoder.deploy.scheduler import LearnedScheduler
from models.offline import THRESHOLD_OFFSETS
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_figure, log_files, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)


def evaluate_rows(
    params: Params,
    cells: list[tuple[str, str]],
    policies: dict,
    deployments: Mapping[str, Deployment],
    students: Mapping[str, LearnedScheduler],
    fixed_parts: Mapping[tuple[str, str], PricedCell],
) -> tuple[list[dict], dict[tuple[str, str], PricedCell]]:
    """Every cell's priced rows (in ``evaluate.workers`` processes) and the priced cells, the
    policies replayed here and merged with each cell's stored ``fixed_parts``. Every one
    of ``students`` is replayed on every cell (the held-back check of the pair check's choice);
    only the rows of ``policies``, the fixed methods and ``deployed`` are returned, the last a copy
    of the row of the method its pair's bundle deploys (``deployments``), with ``deployed_as``."""
    cfg = params.evaluate
    adaptive = {t.name: AdaptiveTiers(t) for t in GRID}  # every variant: the pairs chose different ones
    extra = {n: p for n, p in {**students, **adaptive}.items() if n not in policies}
    with tqdm(total=len(cells) * cfg.prompts_per_cell, desc="evaluate (policy replay)", unit="prompt") as bar:
        priced_by_cell = priced_cells(
            params, cells, {**policies, **extra}, {}, bar.update, hindsight=False, fixed_parts=fixed_parts
        )
    rows = []
    for pair_id, dataset in cells:
        priced = priced_by_cell[(pair_id, dataset)]
        log.info("%s %s: best fixed schedule in hindsight %s", pair_id, dataset, priced.best_fixed)
        deploys = method_of(priced, deployments[pair_id].decision["deploys"])
        chosen = deployments[pair_id].adaptive.name
        for row in cell_rows(priced, cfg.bootstrap, deploys, drop=tuple(extra), adaptive=chosen):
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
            rows.append(row)
    return rows, priced_by_cell


def method_of(priced: PricedCell, deploys: str) -> str:
    """The cell's method a bundle's ``deploys`` names: itself, or, for a fixed schedule deployed by its
    bits (the budget stage's), the fixed method with that schedule (``budget``)."""
    if deploys in priced.methods:
        return deploys
    named = [n for n, m in priced.methods.items() if m.schedule == deploys and n != "best-fixed"]
    if not named:
        raise ValueError(
            f"the pair deploys {deploys!r}, which no method of this cell is: {sorted(priced.methods)}"
        )
    return BUDGET if BUDGET in named else named[0]


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


def main(params: Params) -> dict:
    apply_runtime(params)
    cfg = params.evaluate
    check_registered(params, [*cfg.pairs, *cfg.ablation.pairs], "evaluate")
    out = resolve(cfg.out_dir)
    depth = params.tree.depth
    with stage_run("evaluate", params):
        loaded = load_evaluated(params, cfg.pairs, THRESHOLD_OFFSETS)
        students, policies, deployments = loaded.students, loaded.learned, loaded.deployments
        checks = {p: pair_check_of(d) for p, d in deployments.items()}
        cells = [(p, d) for p in cfg.pairs for d in cfg.datasets]
        fixed_parts, ablations = read_fixed(fixed_path(out), cells)
        rows, priced_by_cell = evaluate_rows(params, cells, policies, deployments, students, fixed_parts)
        fitting = [d for d in cfg.datasets if d not in cfg.held_out_datasets]
        transfer = threshold_transfer(priced_by_cell, checks, fitting)
        first = {p: priced_by_cell[(p, cfg.datasets[0])] for p in cfg.pairs}
        deploys = {p: method_of(first[p], d.decision["deploys"]) for p, d in deployments.items()}
        chosen = {p: c["adaptive"] for p, c in checks.items()}
        headline = deployed_headline(priced_by_cell, deploys, chosen, cell_groups(rows))
        metrics = {**summary_metrics(rows), "pair_check": checks, "threshold_transfer": transfer,
                   "headline": headline}  # fmt: skip
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
