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

Writes ``graft_eval.out_dir``: ``graft.md`` (the table), ``costs.json`` (the measured costs) and
``metrics.json`` (every cell's rows, the done-when checks, overheads, seconds).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np
from tqdm import tqdm

from collectors.collect.batch_greedy import greedy_batch
from collectors.collect.plan import (
    dataset_file,
    load_registered_pair,
    profile_for,
    profile_path,
    report_questions,
)
from collectors.collect.report import ReportSpec, prompt_digest, read_continuations
from collectors.evaluation.fixed_cells import fixed_path, read_fixed
from collectors.evaluation.priced_eval import Cell, PricedCell, prompts_digest
from collectors.graft.budget import (
    Arm,
    arm_totals,
    best_arm,
    choice_arms,
    choice_specs,
    learned_budget,
    left_out_speedups,
    round_price,
    rule_price,
    walk_choice_prompt,
)
from collectors.graft.costs import GraftCosts, measure_costs
from collectors.graft.table import ROWS, markdown, markdown_wall, row_stats
from collectors.graft.walk import decode_ar, decode_arm
from config.params import Params, resolve
from decoder.core.config import BlockBudgetRule
from decoder.graft.block import BlockProposer
from decoder.graft.drafter import load_block_drafter
from decoder.graft.edge_scorer import EdgeScorer, load_edge_scorer
from decoder.io.files import replace_atomically
from decoder.models.pair import ModelPair
from models.budget_rule import cross_fitted_speedups, fit_budget_rule
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


def cut_outputs(gs: Sequence[Sequence[int]], n: int, eos: Sequence[int]) -> list[list[int]] | None:
    """Each continuation's first ``n`` tokens, ending after its first EOS: the greedy output a
    decode of ``n`` new tokens emits; None if one is shorter than ``n``."""
    if any(len(g) < n for g in gs):
        return None
    stop, outputs = set(eos), []
    for g in gs:
        out = [int(t) for t in g[:n]]
        end = next((i + 1 for i, t in enumerate(out) if t in stop), n)
        outputs.append(out[:end])
    return outputs


def collected_outputs(
    params: Params, collected: Mapping[tuple[str, str], Sequence[int]], pair_id: str,
    prompts: Sequence[list[int]], eos: Sequence[int],
) -> list[list[int]] | None:  # fmt: skip
    """The target's greedy output of each prompt (as :func:`stored_outputs`), cut from the
    continuations the collect stage stored for the same pair and prompts (``collected``:
    collectors.collect.report.read_continuations); None unless it holds one for every prompt."""
    gs = [collected.get((pair_id, prompt_digest(p))) for p in prompts]
    if any(g is None for g in gs):
        return None
    return cut_outputs(gs, params.graft_eval.max_new_tokens, eos)  # type: ignore[arg-type]


def stored_outputs(
    params: Params,
    parts: Mapping[Cell, PricedCell],
    cell: Cell,
    prompts: Sequence[list[int]],
    eos: Sequence[int],
) -> list[list[int]] | None:
    """The target's greedy output of each of the cell's prompts (``graft_eval.max_new_tokens``,
    ending after its first EOS), cut from the continuations the evaluate_fixed stage stored for the
    same cell on the same prompts; None where it has none for them (a pair or a prompt count of
    this stage's own)."""
    part = parts.get(cell)
    if part is None or part.prompts_sha256 != prompts_digest(prompts):
        return None
    return cut_outputs([g for g, _ in part.continuations], params.graft_eval.max_new_tokens, eos)


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
    b, b_max = edges.budget, cfg.budget_max
    choice, rules, task_arms = choose_budgets(params, pair, pair_id, drafter, scorer, costs, collected)
    # key -> (budget, TDES, per-round rule)
    arms: dict[str, Arm] = {
        "ddtree": (b, False, None), "tdes": (b, True, None), "saba": (costs.saba(b_max, False), False, None),
        "graft": (costs.saba(b_max, True), True, None), "learned": (choice["plain"]["budget"], False, None),
        "graft_learned": (choice["tdes"]["budget"], True, None),
        "rule": (rules["plain"].cap, False, rules["plain"]),
        "graft_rule": (rules["tdes"].cap, True, rules["tdes"]),
    }  # fmt: skip
    once = arms["graft_rule" if choice["tdes"]["use_rule"] else "graft_learned"]  # full GRAFT, all tasks
    per_task = task_arms if choice["per_task"]["use"] else {}
    n_wall = min(cfg.wall_prompts_per_cell, cfg.prompts_per_cell)
    cells, checked, decodes, reused, full_by_dataset = [], 0, 0, 0, {}
    bar = tqdm(total=sum(map(len, prompts.values())), desc=f"evaluate_graft {pair_id}", unit="prompt")
    for dataset, dataset_prompts in prompts.items():
        task = per_task.get(dataset)
        arms["full"] = once if task is None else task
        budget, tdes, rule = arms["full"]
        full_by_dataset[dataset] = {"budget": budget, "tdes": tdes, "rule": rule is not None,
                                    "per_task": task is not None}  # fmt: skip
        runs: dict[str, list] = {key: [] for key in arms}  # walked rounds, every prompt
        decoded: dict[str, list] = {key: [] for key in arms}  # real decodes, the first n_wall prompts
        walks, ar_runs = [], []
        # the output every row emits (lossless: the target's greedy continuation): decoded with DDTree
        # at b on the wall-clock prompts (that decode is one of the timed rows), from a batch elsewhere
        stored = stored_outputs(params, parts, (pair_id, dataset), dataset_prompts, pair.eos_token_ids)
        reused += stored is not None
        batched = (
            stored[n_wall:]
            if stored is not None
            else greedy_batch(
                pair.target, dataset_prompts[n_wall:], cfg.max_new_tokens, pair.vocab_size, pair.eos_token_ids
            )
        )
        for i, prompt in enumerate(dataset_prompts):
            output = batched[i - n_wall] if i >= n_wall else None
            walked = walk_choice_prompt(pair, drafter, scorer, prompt, b, b_max, edges.topk,
                                        cfg.max_new_tokens, output)  # fmt: skip
            decodes += walked.run is not None
            tokens = walked.output
            walks.append(walked.plain.every_budget())
            for key, (budget, tdes, rule) in arms.items():
                if rule is not None:
                    runs[key].append((walked.tdes if tdes else walked.plain).ruled(rule))
                else:
                    runs[key].append(walked.tdes.fixed(budget) if tdes else walks[-1].at(budget))
            if i >= n_wall:
                bar.update()
                continue
            done: dict[tuple, object] = {(b, False, None): walked.run}
            for key, arm in arms.items():
                if arm not in done:
                    budget, tdes, rule = arm
                    done[arm] = decode_arm(pair, drafter, scorer if tdes else None, prompt, budget,
                                           edges.topk, cfg.max_new_tokens, rule)  # fmt: skip
                    decodes += 1
                run = done[arm]
                if run.tokens != tokens:
                    raise RuntimeError(f"{pair_id}/{dataset}: row {key!r} emitted another output than DDTree")
                if run.rounds != runs[key][-1]:
                    raise RuntimeError(
                        f"{pair_id}/{dataset} prompt {i}: row {key!r}'s exact walk differs from its decoding"
                    )
                checked += 1
                decoded[key].append(run)
            ar_runs.append(decode_ar(pair, prompt, cfg.max_new_tokens))
            if ar_runs[-1].tokens != tokens:
                raise RuntimeError(f"{pair_id}/{dataset}: autoregressive decoding emitted another output")
            bar.update()
        rows = {}
        for key, (budget, tdes, rule) in arms.items():
            if rule is None:
                price = functools.partial(round_price, costs, tdes, key in ("saba", "graft"))
            else:
                price = functools.partial(rule_price, costs, tdes, rule.cap)
            rows[key] = row_stats(budget, runs[key], price, costs.ar_token_ms)
        plain = functools.partial(round_price, costs, False, False)
        grid = [
            row_stats(bb, [w.at(bb) for w in walks], plain, costs.ar_token_ms) for bb in range(1, b_max + 1)
        ]
        rows["hindsight"] = max(grid, key=lambda r: (r.speedup, -r.budget))
        equal = grid[arms["graft_learned"][0] - 1]  # plain DDTree at TDES's learned B: A at equal budget
        group = "held-out task" if dataset in ev.held_out_datasets else "fitting"
        cells.append(
            {"pair_id": pair_id, "dataset_id": dataset, "group": group, "prompts": len(dataset_prompts),
             "rows": {k: rows[k].to_json() for k, _ in ROWS}, "wall": wall_speedups(ar_runs, decoded),
             "wall_prompts": n_wall,
             "ddtree_at_tdes_learned_budget": equal.to_json()}
        )  # fmt: skip
    bar.close()
    summary = {
        "drafter_id": drafter_id,
        "budgets": {k: v[0] for k, v in arms.items() if k != "full"},
        "full_by_dataset": full_by_dataset,
        "overhead_ms_at_rule_cap": costs.rule_overhead_ms(rules["tdes"].cap),
        "learned_budget": choice,
        "saba_line_ms": list(costs.saba_line(b_max, False)),
        "saba_tdes_line_ms": list(costs.saba_line(b_max, True)),
        "overhead_ms_at_budget": costs.overhead_ms(b),
        "overhead_ms_at_graft_budget": costs.overhead_ms(arms["graft"][0]),
        "decodes": decodes,
        "cells_from_stored_continuations": reused,  # of evaluate_fixed, instead of a batched decode
        "walk_checked_runs": checked,  # (prompt, row) decodes whose rounds the exact walk reproduced
        "seconds": time.perf_counter() - t0,
    }
    log.info("%s: %s", pair_id, summary)
    return cells, costs, summary


def choose_budgets(
    params: Params,
    pair: ModelPair,
    pair_id: str,
    drafter: BlockProposer,
    scorer: EdgeScorer,
    costs: GraftCosts,
    collected: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> tuple[dict, dict[str, BlockBudgetRule], dict[str, Arm]]:
    """B_learned and the per-round rule, by marginals ("plain") and by TDES ("tdes"), from the
    collect prompts only (module docstring, rows 5 to 7): (summary, rules, each fitting task's own
    arm, for full GRAFT where the summary's ``per_task.use`` says so). ``collected``: the collect
    stage's continuations, which give the prompts' outputs where they hold them all."""
    cfg, edges = params.graft_eval, params.edges
    t0 = time.perf_counter()
    groups, reused = [], 0
    specs = choice_specs(params, pair_id)
    for spec in tqdm(specs, desc=f"evaluate_graft {pair_id} (budget choice)", unit="dataset"):
        prompts = report_questions(params, spec, pair.tokenizer)[1]
        outputs = collected_outputs(params, collected or {}, pair_id, prompts, pair.eos_token_ids)
        reused += outputs is not None
        if outputs is None:
            outputs = greedy_batch(
                pair.target, prompts, cfg.max_new_tokens, pair.vocab_size, pair.eos_token_ids
            )
        groups.append([walk_choice_prompt(pair, drafter, scorer, prompt, edges.budget, cfg.budget_max,
                                          edges.topk, cfg.max_new_tokens, output)
                       for prompt, output in zip(prompts, outputs, strict=True)])  # fmt: skip
    walks = [w for g in groups for w in g]
    out, rules = {}, {}
    for name, tdes in (("plain", False), ("tdes", True)):
        price = functools.partial(round_price, costs, tdes, False)
        split = [[w.tdes if tdes else w.plain for w in g] for g in groups]
        got = [w for g in split for w in g]
        budget, curve = learned_budget(got, price, costs.ar_token_ms, cfg.budget_max)
        rules[name], rule_summary = fit_budget_rule(got, budget, curve[budget - 1], costs, tdes,
                                                    cfg.rule_caps, cfg.rule_l2)  # fmt: skip
        oof = (curve[budget - 1], rule_summary["collect_speedup"])
        if len(groups) >= 2:  # out of fold by dataset: the fair comparison of the two
            oof = cross_fitted_speedups(split, costs, tdes, cfg.rule_caps, cfg.rule_l2, cfg.budget_max)
        out[name] = {"budget": budget, "collect_speedup": curve[budget - 1],
                     "collect_speedup_at_fixed_budget": curve[edges.budget - 1], "rule": rule_summary,
                     "oof_speedup_fixed": oof[0], "oof_speedup_rule": oof[1],
                     "use_rule": oof[1] > oof[0]}  # fmt: skip
    arms = choice_arms(cfg.budget_max, (rules["plain"], rules["tdes"]))
    tasks = {s.dataset_id: np.stack([arm_totals(w, costs, arms) for w in g])
             for s, g in zip(specs, groups, strict=True)}  # fmt: skip
    task_arms = {task: arms[best_arm(totals)] for task, totals in tasks.items()}
    summary = {
        t: {"budget": b, "tdes": tdes, "rule": rule is not None} for t, (b, tdes, rule) in task_arms.items()
    }
    out["per_task"] = {"arms": summary, "use": False}
    if len(tasks) >= 2 and min(len(t) for t in tasks.values()) >= 2:
        by_task, pooled = left_out_speedups(tasks, costs.ar_token_ms)
        out["per_task"].update(left_out_speedup=by_task, left_out_speedup_pooled=pooled, use=by_task > pooled)
    out["prompts"] = len(walks)
    out["datasets_from_collected_continuations"] = reused  # of collect, instead of a batched decode
    out["questions"] = {s.dataset_id: [s.prompt_start, s.prompt_stop] for s in specs}
    out["seconds"] = time.perf_counter() - t0
    log.info("%s: learned budgets %s", pair_id, out)
    return out, rules, task_arms


def wall_speedups(ar_runs: list, runs: dict[str, list]) -> dict[str, float]:
    """Per decoded row: AR's decoding seconds over the row's, summed over the cell's prompts (each
    prompt's rows and AR decoded back to back; prefill excluded on both sides, as in pricing)."""
    ar_s = sum(r.decode_s for r in ar_runs)
    return {key: ar_s / sum(r.decode_s for r in row) for key, row in runs.items()}


def checks(cells: list[dict], pairs: dict[str, dict]) -> dict:
    """The issue's done-when targets on these cells."""
    n = len(cells)

    def share(pred) -> float:  # of the cells
        return sum(bool(pred(c)) for c in cells) / n

    def at_least(a: str, b: str, key: str = "speedup") -> float:  # share of cells where row a >= row b
        return share(lambda c: c["rows"][a][key] >= c["rows"][b][key])

    mean = {k: sum(c["rows"][k]["speedup"] for c in cells) / n for k, _ in ROWS}
    return {
        "n_cells": n,
        "graft_at_least_hindsight": at_least("graft", "hindsight"),
        "full_graft_at_least_hindsight": at_least("full", "hindsight"),
        "graft_learned_fixed_at_least_hindsight": at_least("graft_learned", "hindsight"),
        "graft_rule_at_least_hindsight": at_least("graft_rule", "hindsight"),
        "rule_at_least_learned_fixed": at_least("rule", "learned"),
        "learned_at_least_saba_on_mean": mean["learned"] >= mean["saba"],
        "rule_at_least_saba_on_mean": mean["rule"] >= mean["saba"],
        "full_graft_at_least_saba_graft_on_mean": mean["full"] >= mean["graft"],
        "tdes_raises_a": share(
            lambda c: c["rows"]["tdes"]["mean_accepted"] > c["rows"]["ddtree"]["mean_accepted"]
        ),
        "tdes_keeps_or_raises_a": at_least("tdes", "ddtree", "mean_accepted"),
        "tdes_raises_a_at_learned_budget": share(
            lambda c: (
                c["rows"]["graft_learned"]["mean_accepted"]
                > c["ddtree_at_tdes_learned_budget"]["mean_accepted"]
            )
        ),
        "mean_speedup": mean,
        "mean_wall_speedup": {k: sum(c["wall"][k] for c in cells) / n for k in cells[0]["wall"]},
        "priced_over_wall": {
            k: sum(c["rows"][k]["speedup"] / c["wall"][k] for c in cells) / n for k in cells[0]["wall"]
        },
        "max_overhead_ms": max(
            max(p["overhead_ms_at_budget"], p["overhead_ms_at_graft_budget"], p["overhead_ms_at_rule_cap"])
            for p in pairs.values()
        ),
    }


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
        metrics = {**checks(cells, pairs), "pairs": pairs, "seconds": time.perf_counter() - t0}
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
