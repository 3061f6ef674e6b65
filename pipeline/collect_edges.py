"""DVC stage ``collect_edges``: TDES training data from greedy DDTree rounds of the zoo block drafters.

For each ``edges.pairs[i]`` with the zoo block drafter ``edges.drafters[i]`` (loaded from
zoo.out_dir and checked against the pair's target), the first ``edges.prompts_per_dataset``
questions of each of ``edges.datasets`` from collect.prompt_start on (the collect slice, never
reaching evaluate.prompt_start) are decoded greedily with DDTree at ``edges.budget`` nodes and
``edges.topk`` candidates per position; collectors/graft/edges.py records and labels every round.

Writes ``edges.collect_dir``: ``edge_rounds.parquet``, ``edges.parquet`` (features/edge_schemas.py)
and ``metrics.json`` (rows, positives, rounds, tokens and seconds per pair).
"""

from __future__ import annotations

import logging
import time

from collectors.collect.plan import dataset_file, load_registered_pair, report_questions
from collectors.collect.report import ReportSpec
from collectors.graft.edges import Columns, PromptKey, collect_prompt, new_columns
from config.params import Params, resolve
from decoder.core.config import BlockConfig
from decoder.graft.drafter import load_block_drafter
from features.edge_schemas import EDGE_ROUNDS, EDGES
from features.tables import write_table
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run, write_json

log = logging.getLogger(__name__)


def validate(params: Params) -> None:
    cfg = params.edges
    if len(cfg.pairs) != len(cfg.drafters) or not cfg.pairs:
        raise ValueError(
            f"edges.pairs {list(cfg.pairs)} and edges.drafters {list(cfg.drafters)} must be non-empty "
            "lists of equal length (pairs[i] is decoded with drafters[i])"
        )
    unknown = [p for p in cfg.pairs if p not in params.pairs]
    if unknown:
        raise ValueError(f"edges.pairs: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}")
    zoo = resolve(params.zoo.out_dir)
    absent = [d for d in cfg.drafters if not (zoo / d).is_dir()]
    if absent:
        raise ValueError(f"edges.drafters: no block drafter folder {absent} under {zoo}; run the zoo stage")
    missing = [d for d in cfg.datasets if not dataset_file(params, d).is_file()]
    if missing:
        raise ValueError(f"edges.datasets: no question file for {missing} under {params.data.out_dir}")
    for name in ("prompts_per_dataset", "max_new_tokens", "budget", "topk"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"edges.{name} must be positive, got {getattr(cfg, name)}")
    stop = params.collect.prompt_start + cfg.prompts_per_dataset
    if stop > params.evaluate.prompt_start:
        raise ValueError(
            f"edges.prompts_per_dataset={cfg.prompts_per_dataset} from collect.prompt_start reaches "
            f"question {stop - 1}, at or past evaluate.prompt_start={params.evaluate.prompt_start}: "
            "the evaluate prompts are held back"
        )


def collect_pair(params: Params, pair_id: str, drafter_id: str, rounds: Columns, edges: Columns) -> dict:
    """Decode the pair's prompt slice with its drafter into the columns; returns the pair's counts."""
    cfg = params.edges
    t0 = time.perf_counter()
    pair = load_registered_pair(params, pair_id)
    drafter = load_block_drafter(resolve(params.zoo.out_dir) / drafter_id, pair.target)
    block = BlockConfig(budget=cfg.budget, topk=cfg.topk, k=drafter.k)
    start = params.collect.prompt_start
    n_before = len(rounds.data["accepted"])
    totals = {"prompts": 0, "rounds": 0, "skipped_rounds": 0, "new_tokens": 0, "argmax_disagreements": 0}
    for dataset in cfg.datasets:
        spec = ReportSpec(pair_id, dataset, start, start + cfg.prompts_per_dataset)
        _, prompts = report_questions(params, spec, pair.tokenizer)
        for question_index, prompt in enumerate(prompts):
            key = PromptKey(pair_id, drafter_id, dataset, start + question_index)
            stats = collect_prompt(pair, drafter, prompt, key, block, cfg.max_new_tokens, rounds, edges)
            totals["prompts"] += 1
            totals["rounds"] += stats.rounds
            totals["skipped_rounds"] += stats.skipped
            totals["new_tokens"] += stats.new_tokens
            totals["argmax_disagreements"] += stats.argmax_disagreements
    totals["seconds"] = time.perf_counter() - t0
    accepted = rounds.data["accepted"][n_before:]
    totals["mean_accepted"] = sum(accepted) / len(accepted) if accepted else 0.0
    log.info("%s with %s: %s", pair_id, drafter_id, totals)
    return totals


def main(params: Params) -> dict:
    validate(params)
    apply_runtime(params)
    out = resolve(params.edges.collect_dir)
    rounds, edges = new_columns()
    with stage_run("collect_edges", params):
        per_pair = {}
        for pair_id, drafter_id in zip(params.edges.pairs, params.edges.drafters, strict=True):
            per_pair[pair_id] = collect_pair(params, pair_id, drafter_id, rounds, edges)
        round_table, edge_table = rounds.table(), edges.table()
        write_table(out / "edge_rounds.parquet", EDGE_ROUNDS, round_table)
        write_table(out / "edges.parquet", EDGES, edge_table)
        positives = sum(edge_table.column("is_target").to_pylist())
        metrics = {
            "n_rounds": round_table.num_rows,
            "n_edges": edge_table.num_rows,
            "n_positive_edges": positives,
            "pairs": per_pair,
        }
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
    return metrics


if __name__ == "__main__":
    run_stage("collect_edges", main)
