"""DVC stage ``evaluate``: the paper's main table and ablations, decoded end to end.

Per (pair, dataset) cell: autoregressive, All-Small, All-Mid, 10101, the best fixed schedule in
hindsight (chosen by replay on the same prompts), the value planner and the exported student, all
with real verification, wall-clock timing and identical warm-up, plus the same runs re-priced with
the pair's latency profile. Held-out pairs (never collected) and tasks (never fitted) are marked.
Ablations under the fixed schedule: full, no extended grafting, overwrite grafting, sequential
cascade, with the mechanism statistics. Any method whose output differs from autoregressive
decoding fails the stage. Writes under evaluate.out_dir: results.json, table.md, ablations.md,
metrics.json, plots (PNG + CSV for `dvc plots`) and Spec-Bench answer files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from collectors.eval_report import (
    ablation_table,
    calls_plot,
    main_table,
    plot_rows,
    speedup_plot,
    summary_metrics,
)
from collectors.evaluation import best_fixed_in_hindsight, evaluate_cell
from collectors.plan import load_registered_pair, profile_for, report_questions, tree_config
from collectors.records import runtime_for
from collectors.report import ReportSpec
from config.params import Params, resolve
from decoder.config import DecodeConfig, Grafting
from decoder.measure import Method
from decoder.scheduler import load_scheduler, load_value_planner
from pipeline.cli import apply_runtime, run_stage
from pipeline.tracking import log_figure, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)


def _cell_inputs(params: Params, pair_id: str, dataset: str, pair):
    cfg = params.evaluate
    spec = ReportSpec(pair_id, dataset, cfg.prompt_start, cfg.prompt_start + cfg.prompts_per_cell)
    questions, prompts = report_questions(params, spec, pair.tokenizer)
    profile = profile_for(params, pair_id)
    runtime = runtime_for(profile, sum(map(len, prompts)) / len(prompts), tree_config(params.tree))
    return questions, prompts, profile, runtime


def main_methods(params: Params, pair, prompts, profile, config: DecodeConfig) -> list[Method]:
    tree = tree_config(params.tree)
    export = resolve(params.export.out_dir)
    student = load_scheduler(export / "scheduler.json", tree.depth, tree.width)
    planner = load_value_planner(export / "value_planner.json", tree.depth, tree.width)
    best = best_fixed_in_hindsight(pair, prompts, config, profile)
    log.info("best fixed schedule in hindsight: %s", best)
    return [
        Method("all-small", "all-small"),
        Method("all-mid", "all-mid"),
        Method("10101", "10101"),
        Method("best-fixed", best),
        Method("value-planner", planner),
        Method("student", student),
    ]


def ablation_methods(params: Params) -> list[Method]:
    tree, schedule = tree_config(params.tree), params.evaluate.ablation.schedule
    return [
        Method("full", schedule, tree),
        Method("no-eg", schedule, replace(tree, extended_grafting=False)),
        Method("overwrite", schedule, replace(tree, grafting=Grafting.OVERWRITE)),
        Method("cascade", schedule, replace(tree, sequential=True)),
    ]


def _run_cells(params: Params, cells: list[tuple[str, str]], ablation: bool, out: Path) -> list[dict]:
    cfg = params.evaluate
    config = DecodeConfig(cfg.max_new_tokens, 0.0, params.collect.seed, tree_config(params.tree))
    rows = []
    for pair_id, dataset in tqdm(cells, desc="ablations" if ablation else "evaluate", unit="cell"):
        pair = load_registered_pair(params, pair_id)
        questions, prompts, profile, runtime = _cell_inputs(params, pair_id, dataset, pair)
        methods = (
            ablation_methods(params) if ablation else main_methods(params, pair, prompts, profile, config)
        )
        cell = evaluate_cell(pair, questions, prompts, methods, config, runtime, profile)
        for row in cell.rows:
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
        rows += cell.rows
        if not ablation:
            for method, answers in cell.answers.items():
                path = out / "specbench" / method / f"{pair_id}__{dataset}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(a) + "\n" for a in answers))
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
        rows = _run_cells(params, [(p, d) for p in cfg.pairs for d in cfg.datasets], False, out)
        ablations = _run_cells(
            params, [(p, d) for p in cfg.ablation.pairs for d in cfg.ablation.datasets], True, out
        )
        metrics = summary_metrics(rows)
        table, abl = main_table(rows), ablation_table(ablations)
        write_json(out / "results.json", {"main": rows, "ablations": ablations})
        write_json(out / "metrics.json", metrics)
        (out / "table.md").write_text(table + "\n")
        (out / "ablations.md").write_text(abl + "\n")
        speed, calls = plot_rows(rows, depth)
        write_csv(out / "plots" / "speedup.csv", speed)
        write_csv(out / "plots" / "calls_per_step.csv", calls)
        log_figure(speedup_plot(rows, out / "speedup.png"), "speedup.png")
        log_figure(calls_plot(rows, depth, out / "calls_per_step.png"), "calls_per_step.png")
        log_metrics(metrics)
        import mlflow

        for name in ("table.md", "ablations.md", "results.json"):
            mlflow.log_artifact(str(out / name))
    print(table)
    print()
    print(abl)
    return metrics


if __name__ == "__main__":
    run_stage("evaluate", main)
