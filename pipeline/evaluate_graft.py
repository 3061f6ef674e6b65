"""DVC stage ``evaluate_graft``: GRAFT's rows per block-drafter pair x dataset, priced, on held-back prompts.

For each ``edges.pairs[i]`` with its zoo block drafter ``edges.drafters[i]`` and its TDES scorer
(``edges.fit_dir/scorers/<pair>``, out of the fit_edges stage), on ``graft_eval.prompts_per_cell``
questions of each of ``evaluate.datasets`` from ``evaluate.prompt_start`` on (the held-back slice,
never seen by collect, collect_edges or fit_edges), ``graft_eval.max_new_tokens`` new tokens each:

1. DDTree at the fixed B = ``edges.budget``,
2. DDTree at the best fixed B in hindsight, per cell over B = 1..``graft_eval.budget_max``, from one
   check of the largest tree per start position (collectors/graft/walk.py, BudgetWalker),
3. DDTree + TDES at the same B,
4. DDTree + SABA (the paper's rule on this stage's cost line; one budget per pair) without and with
   TDES (GRAFT with the paper's budget),
5. DDTree at a learned B, without and with TDES:
   one B per pair, chosen before any held-back prompt is read, on the collect prompts of the
   fitting datasets (collectors/graft/budget.py) by the same exact walk and the same prices, as the
   B with the most tokens per priced ms over them all. The TDES scorer there is the exported one,
   fitted on those same prompts (fit_edges' out-of-fold scorers are not exported), so the TDES
   choice sees a scorer at least as good on them as on held-back prompts.
6. DDTree with a learned per-round budget, without and with TDES: each round's B_t from its own
   tree by a node acceptance model and the cost curve (decoder/graft/budget.py), fitted and its
   cap chosen on the same collect prompts (models/budget_rule.py).
7. Full GRAFT: the learned budget, chosen before any held-back prompt is read, per task where that
   prices faster on the collect prompts out of fold. Per task: each fitting dataset gets the arm
   with the most tokens per priced ms on its own collect prompts, of every fixed B with or without
   TDES and the pair's two per-round rules (by marginals, by TDES; choice_arms in
   collectors/graft/budget.py): TDES stays off where its scoring costs more than the tokens it
   adds. Once for all tasks: TDES with row 5's fixed B or row 6's per-round rule, whichever prices
   faster out of fold by dataset (each fitting dataset's prompts priced under the budget chosen on
   the others; models/budget_rule.py). Per task is used when, leaving each collect prompt out in
   turn, the arm chosen on its task's other prompts prices it faster in sum than the arm chosen on
   all other prompts (collectors/graft/budget.py, left_out_speedups); held-out tasks, with no
   collect prompts, take the choice made once for all tasks.

Every row's rounds on every prompt come from the exact walks of the prompt's output
(collectors/graft/walk.py, BudgetWalker: by marginals and TDES-ranked, at a fixed B or under a
rule), the target's greedy continuation, checked by one teacher-forced forward (lossless_gate): on
the wall-clock prompts DDTree's output at the fixed B; elsewhere the continuation the evaluate_fixed
stage stored for the same cell and prompts (``<evaluate.out_dir>/fixed/fixed.json``); on the
collect prompts the budget choice reads, the one the collect stage stored for the same pair and
prompt (``<collect.out_dir>/continuations.parquet``); and where neither has one, batched greedy
decoding's (collectors/collect/batch_greedy.py), a prompt whose batched output the gate rejects being decoded
alone. Each is cut to ``graft_eval.max_new_tokens`` and its first EOS. On
the first ``graft_eval.wall_prompts_per_cell`` prompts of a cell every row is also decoded for real
(identical configurations once), back to back with autoregressive decoding (the wall-clock
table): the stage fails if an output differs from the target's greedy continuation or a decode's
rounds from its walk's. Pricing is deterministic given the costs measured at the start of each pair
(collectors/graft/costs.py) and the pair's latency profile (``profile.out_dir/<pair>.json``).

Writes ``graft_eval.out_dir``: ``graft.md`` (the table), ``costs.json`` (the measured costs),
``cells.json`` (every cell's rows) and ``metrics.json`` (the done-when checks, overheads, seconds).

The stage loads and writes; the work is below it: the budget choice in models/budget_choice.py, a
cell's walks, decodes, checks and rows in collectors/graft/cells.py, the outputs each prompt must
emit in collectors/graft/outputs.py, the done-when checks in collectors/graft/done_when.py and the
tables in collectors/graft/table.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence

from tqdm import tqdm

from collectors.collect.plan import (
    dataset_file,
    load_registered_pair,
    profile_for,
    profile_path,
    report_questions,
)
from collectors.collect.report import ReportSpec, read_continuations
from collectors.evaluation.fixed_cells import fixed_path, read_fixed
from collectors.evaluation.headline import graft_headline
from collectors.evaluation.priced_eval import Cell, PricedCell
from collectors.graft.budget import choice_specs
from collectors.graft.cells import GraftSetup, evaluate_cell, full_graft, row_arms
from collectors.graft.costs import GraftCosts, measure_costs
from collectors.graft.done_when import done_when_checks
from collectors.graft.outputs import greedy_outputs, stored_outputs
from collectors.graft.table import markdown, markdown_wall
from config.params import Params, resolve
from decoder.graft.drafter import load_block_drafter
from decoder.graft.edge_scorer import load_edge_scorer
from decoder.io.files import replace_atomically
from models.budget_choice import choose_budgets
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)


def validate(params: Params) -> None:
    cfg, edges = params.graft_eval, params.edges
    for name in ("prompts_per_cell", "wall_prompts_per_cell", "max_new_tokens", "budget_max",
                 "choice_prompts_per_dataset", "repeats", "passes"):  # fmt: skip
        if getattr(cfg, name) <= 0:
            raise ValueError(f"graft_eval.{name} must be positive, got {getattr(cfg, name)}")
    if cfg.warmup < 0:
        raise ValueError(f"graft_eval.warmup must be >= 0, got {cfg.warmup}")
    if not cfg.rule_caps or min(cfg.rule_caps) < 1 or max(cfg.rule_caps) > cfg.budget_max:
        raise ValueError(
            f"graft_eval.rule_caps {list(cfg.rule_caps)} must lie in 1..budget_max={cfg.budget_max}"
        )
    if not cfg.rule_l2 >= 0:
        raise ValueError(f"graft_eval.rule_l2 must be >= 0, got {cfg.rule_l2}")
    if not cfg.cost_sizes or min(cfg.cost_sizes) < 1 or max(cfg.cost_sizes) < cfg.budget_max:
        raise ValueError(
            f"graft_eval.cost_sizes {list(cfg.cost_sizes)} must be positive and reach "
            f"budget_max={cfg.budget_max}"
        )
    if not 1 <= edges.budget <= cfg.budget_max:
        raise ValueError(f"edges.budget={edges.budget} must lie in 1..graft_eval.budget_max={cfg.budget_max}")
    if len(edges.pairs) != len(edges.drafters) or not edges.pairs:
        raise ValueError(
            f"edges.pairs {list(edges.pairs)} and edges.drafters {list(edges.drafters)} must pair up"
        )
    missing = [d for d in params.evaluate.datasets if not dataset_file(params, d).is_file()]
    if missing:
        raise ValueError(f"evaluate.datasets: no question file for {missing} under {params.data.out_dir}")
    missing = [
        s.dataset_id
        for s in choice_specs(params, edges.pairs[0])
        if not dataset_file(params, s.dataset_id).is_file()
    ]
    if missing:
        raise ValueError(f"edges.datasets: no question file for {missing} under {params.data.out_dir}")
    for pair_id in edges.pairs:
        for path in (
            profile_path(params, pair_id),
            resolve(edges.fit_dir) / "scorers" / pair_id,
        ):
            if not path.exists():
                raise ValueError(f"{path}: missing (run the profile and fit_edges stages)")


def evaluate_pair(
    params: Params, pair_id: str, drafter_id: str, parts: Mapping[Cell, PricedCell],
    collected: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> tuple[list[dict], GraftCosts, dict]:  # fmt: skip
    """Every cell of one pair; returns (cells, measured costs, pair summary). ``parts``: the
    evaluate_fixed stage's cells, whose stored continuations give the outputs of the prompts that
    are not decoded for real; ``collected``: the collect stage's continuations, those of the budget
    choice's prompts (else either is decoded in a batch)."""
    cfg, edges, ev = params.graft_eval, params.edges, params.evaluate
    t0 = time.perf_counter()
    pair = load_registered_pair(params, pair_id)
    drafter = load_block_drafter(resolve(params.zoo.out_dir) / drafter_id, pair.target)
    scorer, _ = load_edge_scorer(
        resolve(edges.fit_dir) / "scorers" / pair_id, vocab_size=pair.vocab_size, k=drafter.k
    )
    profile = profile_for(params, pair_id)
    prompts = {}
    for dataset in ev.datasets:
        spec = ReportSpec(pair_id, dataset, ev.prompt_start, ev.prompt_start + cfg.prompts_per_cell)
        prompts[dataset] = report_questions(params, spec, pair.tokenizer)[1]
    context = max((p for ps in prompts.values() for p in ps), key=len)
    costs = measure_costs(pair, pair_id, drafter, scorer, profile, context, edges.topk, cfg.cost_sizes,
                          cfg.warmup, cfg.repeats, cfg.passes)  # fmt: skip
    setup = GraftSetup(
        pair, drafter, scorer, costs, edges.budget, cfg.budget_max, edges.topk, cfg.max_new_tokens
    )
    choice, rules, task_arms = choose_budgets(params, pair, pair_id, drafter, scorer, costs, collected)
    arms = row_arms(setup, choice, rules)
    n_wall = min(cfg.wall_prompts_per_cell, cfg.prompts_per_cell)
    cells, full_by_dataset, decodes, checked, reused = [], {}, 0, 0, 0
    bar = tqdm(total=sum(map(len, prompts.values())), desc=f"evaluate_graft {pair_id}", unit="prompt")
    for dataset, dataset_prompts in prompts.items():
        full, full_by_dataset[dataset] = full_graft(arms, choice, task_arms, dataset)
        # the output every row emits (lossless: the target's greedy continuation): decoded with DDTree
        # at the fixed B on the wall-clock prompts (one of the timed rows), stored or batched elsewhere
        stored = stored_outputs(params, parts, (pair_id, dataset), dataset_prompts, pair.eos_token_ids)
        reused += stored is not None
        outputs = greedy_outputs(pair, dataset_prompts[n_wall:], cfg.max_new_tokens,
                                 None if stored is None else stored[n_wall:])  # fmt: skip
        held_out = dataset in ev.held_out_datasets
        cell, runs = evaluate_cell(setup, (pair_id, dataset), held_out, dataset_prompts, outputs,
                                   {**arms, "full": full}, n_wall, bar.update)  # fmt: skip
        cells.append(cell)
        decodes, checked = decodes + runs.decodes, checked + runs.checked
    bar.close()
    summary = {
        "drafter_id": drafter_id,
        "budgets": {k: v[0] for k, v in arms.items()},
        "full_by_dataset": full_by_dataset,
        "overhead_ms_at_rule_cap": costs.rule_overhead_ms(rules["tdes"].cap),
        "learned_budget": choice,
        "saba_line_ms": list(costs.saba_line(cfg.budget_max, False)),
        "saba_tdes_line_ms": list(costs.saba_line(cfg.budget_max, True)),
        "overhead_ms_at_budget": costs.overhead_ms(edges.budget),
        "overhead_ms_at_graft_budget": costs.overhead_ms(arms["graft"][0]),
        "decodes": decodes,
        "cells_from_stored_continuations": reused,  # of evaluate_fixed, instead of a batched decode
        "walk_checked_runs": checked,  # (prompt, row) decodes whose rounds the exact walk reproduced
        "seconds": time.perf_counter() - t0,
    }
    log.info("%s: %s", pair_id, summary)
    return cells, costs, summary


def main(params: Params) -> dict:
    validate(params)
    apply_runtime(params)
    t0 = time.perf_counter()
    out = resolve(params.graft_eval.out_dir)
    with stage_run("evaluate_graft", params):
        cells, costs, pairs = [], {}, {}
        ev = params.evaluate
        stored = [(p, d) for p in params.edges.pairs if p in ev.pairs for d in ev.datasets]
        parts = read_fixed(fixed_path(resolve(ev.out_dir)), stored)[0] if stored else {}
        collected = read_continuations(resolve(params.collect.out_dir) / "continuations.parquet")
        for pair_id, drafter_id in zip(params.edges.pairs, params.edges.drafters, strict=True):
            pair_cells, costs[pair_id], pairs[pair_id] = evaluate_pair(params, pair_id, drafter_id, parts,
                                                                       collected)  # fmt: skip
            cells += pair_cells
        table = markdown(cells) + "\n" + markdown_wall(cells)
        metrics = {**done_when_checks(cells, pairs), "pairs": pairs, "seconds": time.perf_counter() - t0,
                   "graft_vs_hindsight": list(graft_headline(cells))}  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        for name, obj in (("costs.json", {p: c.to_json() for p, c in costs.items()}), ("cells.json", cells),
                          ("metrics.json", metrics)):  # fmt: skip
            replace_atomically(out / name, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
        replace_atomically(out / "graft.md", table.encode())
        log_metrics(metrics)
    print(table)
    return metrics


if __name__ == "__main__":
    run_stage("evaluate_graft", main)
