"""DVC stage ``budget``: each pair's verification budget, chosen from its measured cost curves.

For every pair of collect.pairs and evaluate.pairs, on prompts of the collect slice (question
collect.prompt_start + i // n of dataset i mod n of budget.datasets, i < budget.prompts_per_pair;
never reaching evaluate.prompt_start, so the evaluate prompts stay held back), replay sweeps every
budget B in 1..tree.budget for All-Small and All-Mid (collectors/pricing/budget_sweep.py: exact at
temperature 0, priced with the pair's latency profile against AR). The pair's budget is

    B* = argmax over B of max(priced speedup of All-Small(B), All-Mid(B))   (ties: the smaller B),

the max also over ``budget.schedules``, mixed fixed schedules such as 10101, where given.

With ``budget.shapes`` (a list of [width, topk]) the sweep runs once per tree shape and the
best-priced shape's B* wins (ties: the shape whose policies' best speedups sum highest; a CPU wants
narrow trees: a mid call costs what it forwards); the
entry records ``width`` and ``topk`` (collectors/collect/plan.py `pair_tree` decodes with them) and each
shape's own pick. The entry's ``decode_policy`` is what the pair decodes with by default: that
policy at B*, or ``ar`` where no budget of either policy prices faster than AR (on a CPU, a mid
drafter costing most of a target forward, say). Also recorded: each policy's best B and its
curve, and SABA's budget (GRAFT's rule: c_fixed / c_verify of each policy's cost line; the policy
whose SABA budget prices faster).

The per-round rule (``budget.round_gain_scales``; decoder/core/budget.py `verify_budget`): each round
verifies the B_t <= cap that maximises (1 + s x E[A](B)) / (fixed + verify(B + 1)), E[A] from the
round's own path scores, so a round whose drafts are unlikely to be accepted can fall back to one
plain target step. Candidates: caps each policy's best B and tree.budget, s the least-squares
calibration of E[A] to the accepted lengths of the sweep's rounds times each multiplier, fixed 0 or
the policy's mean drafting work; each priced exactly by walking the sweep's outcomes. The best one
replaces the fixed B* only where it prices at least ``budget.round_min_gain`` faster; the entry then
holds ``round_budget`` (verify_ms, fixed_ms, gain_scale) and pair_tree decodes with it.
``mode: fixed`` measures nothing and gives every pair
tree.budget (the stage switched off).

Writes ``budget.out_dir``: ``budgets.json`` (collectors/pricing/budget_file.py reads it), ``budgets.md``,
``speedup_by_budget.png`` and ``plots/speedup_by_budget.csv``, and ``metrics.json``.

The stage loads and writes; the work is below it: the pairs, prompts and shapes in
collectors/pricing/budget_plan.py, the choice of each pair's entry in collectors/pricing/budget_entry.py,
the table, curves and metrics in collectors/pricing/budget_report.py.
"""

from __future__ import annotations

import math
from pathlib import Path

from collectors.collect.plan import (
    dataset_file,
    load_registered_pair,
    profile_for,
    report_questions,
    tree_config,
)
from collectors.pricing.budget_entry import measure_shapes
from collectors.pricing.budget_file import BUDGETS_FILE, write_budgets
from collectors.pricing.budget_plan import budget_pairs, budget_specs, tree_shapes
from collectors.pricing.budget_report import CURVE_COLUMNS, curve_plot, curve_rows, markdown, summary
from config.params import Params, resolve
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_figure, log_files, log_metrics, stage_run, write_csv, write_json

MODES = ("measured", "fixed")


def validate(params: Params) -> None:
    cfg = params.budget
    if cfg.mode not in MODES:
        raise ValueError(f"budget.mode must be one of {MODES}, got {cfg.mode!r}")
    unknown = [p for p in budget_pairs(params) if p not in params.pairs]
    if unknown:
        raise ValueError(
            f"collect/evaluate.pairs: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}"
        )
    depth = params.tree.depth
    odd = [b for b in cfg.schedules if len(b) != depth or set(b) - {"0", "1"}]
    if odd:
        raise ValueError(f"budget.schedules: each entry is a string of {depth} bits (tree.depth), got {odd}")
    max_n = params.tree.ngram_max_n
    bad = [
        list(shape)
        for shape in cfg.shapes
        if len(shape) not in (2, 3) or min(shape) < 1 or (len(shape) == 3 and shape[2] > max_n)
    ]
    if bad:
        raise ValueError(
            "budget.shapes: each entry is [width, topk] or [width, topk, ngram_min_n] of positive ints "
            f"(ngram_min_n <= tree.ngram_max_n = {max_n}), got {bad}"
        )
    if cfg.mode == "fixed":
        return
    if cfg.prompts_per_pair <= 0 or cfg.max_new_tokens <= 0 or not cfg.datasets:
        raise ValueError(
            "budget.prompts_per_pair, budget.max_new_tokens and budget.datasets must be positive"
        )
    missing = [d for d in cfg.datasets if not dataset_file(params, d).is_file()]
    if missing:
        raise ValueError(f"budget.datasets: no question file for {missing} under {params.data.out_dir}")
    stop = params.collect.prompt_start + math.ceil(cfg.prompts_per_pair / len(cfg.datasets))
    if stop > params.evaluate.prompt_start:
        raise ValueError(
            f"budget.prompts_per_pair={cfg.prompts_per_pair} over {len(cfg.datasets)} datasets reaches "
            f"question {stop - 1}, at or past evaluate.prompt_start={params.evaluate.prompt_start}: "
            "the evaluate prompts are held back"
        )


def measure_pair(params: Params, pair_id: str) -> dict:
    """The pair's entry: B* and its policy under the best-priced tree shape (width, topk), each
    shape's own pick recorded under ``shapes`` ("WxM" -> budget, policy, speedup)."""
    pair = load_registered_pair(params, pair_id)
    profile = profile_for(params, pair_id)
    prompts = [
        p for spec in budget_specs(params, pair_id) for p in report_questions(params, spec, pair.tokenizer)[1]
    ]
    tree = tree_config(params.tree)
    shapes, rows = tree_shapes(params), params.runtime.replay_batch_rows
    return measure_shapes(pair_id, pair, profile, prompts, tree, shapes, params.budget, rows)


def write_curves(path: Path, rows: list[dict]) -> None:
    """The curves CSV; with nothing measured (mode fixed) its header alone."""
    if rows:
        write_csv(path, rows)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(",".join(CURVE_COLUMNS) + "\n")


def main(params: Params) -> dict:
    validate(params)
    apply_runtime(params)
    out = resolve(params.budget.out_dir)
    b_max = params.tree.budget
    with stage_run("budget", params):
        if params.budget.mode == "fixed":
            entries = {p: {"mode": "fixed", "budget": b_max} for p in budget_pairs(params)}
        else:
            entries = {p: measure_pair(params, p) for p in budget_pairs(params)}
        table, metrics = markdown(entries, b_max), summary(entries)
        write_budgets(out / BUDGETS_FILE, entries)
        (out / "budgets.md").write_text(table)
        write_curves(out / "plots" / "speedup_by_budget.csv", curve_rows(entries))
        log_figure(curve_plot(entries, out / "speedup_by_budget.png"), "speedup_by_budget.png")
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        log_files([out / BUDGETS_FILE, out / "budgets.md"])
    print(table)
    return entries


if __name__ == "__main__":
    run_stage("budget", main)
