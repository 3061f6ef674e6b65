"""Pricing against the clock: priced / measured round latency per pair and policy.

Usage:
    .venv/bin/python benchmarks/bench_pricing.py [--pairs zoo-m] [--profile-dir artifacts/profile]
        [--policies 00000 11111 10101] [--student artifacts/export/student] [--prompts 4]
        [--max-new-tokens 64] [--threads 2] [--pair-trees] [--components] [--cpu-clock]
        [--datasets alpaca humaneval] [--out artifacts/bench/pricing.json]

Per pair: the latency profile (read from --profile-dir/<pair>.json, or measured now with the
`profile` stage's settings), then collectors.pricing.pricing_check.check_pricing decodes every prompt for
real under every policy (execute mode for fixed schedules; the student, if given, through
generate with its runtime context) and prints priced / measured over all rounds and the per-round
spread. The goal is 0.90-1.10 for every pair and policy. On a shared machine the wall clock also
counts other processes' time (see the "cpu share" column); --cpu-clock times the rounds by CPU
time instead, which checks the cost model itself. `tiny` (built on the spot) stands in when
the zoo is not built yet. --pair-trees decodes with each pair's budgets.json tree (what collect and
evaluate price); --components splits the ratio by component and adds the AR baseline's steps
against the profile's ar_token_ms, which every priced speedup divides by. --datasets checks each
dataset on its own, on the evaluate stage's held-back prompts of that dataset (from
evaluate.prompt_start): a cost the profile misses may show on some kinds of text only (with
--profile-dir artifacts/evaluate/profiles, the profiles evaluate measured beside its decodes).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import decoder.core.decode
from benchmarks.pair_sources import TINY, bench_prompts, load_named
from collectors.collect.plan import pair_tree, report_questions
from collectors.collect.records import runtime_for
from collectors.collect.report import ReportSpec
from collectors.pricing.pricing_check import (
    check_components,
    check_pricing,
    format_components,
    format_pricing,
)
from collectors.pricing.profile_rounds import student_like
from collectors.pricing.profiling import measure_profile
from config.params import load_params, resolve
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.deploy.latency import load_profile
from decoder.deploy.scheduler import load_scheduler
from decoder.models.memory import configure_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default=None, help="params overlay (profiles/NAME.yaml)")
    parser.add_argument("--pairs", nargs="*", default=None, help=f"registered pairs or {TINY!r}")
    parser.add_argument("--zoo-dir", default=None, help="models from here instead of params' zoo.out_dir")
    parser.add_argument("--profile-dir", default=None, help="read <dir>/<pair>.json instead of measuring")
    parser.add_argument("--policies", nargs="*", default=["00000", "11111", "10101"])
    parser.add_argument("--student", default=None, help="an exported student artifact (path stem)")
    parser.add_argument(
        "--random-student",
        action="store_true",
        help="also a scheduler of the student's shape with random weights (the decision work, any answers)",
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=None, help="profile repeats (default: params)")
    parser.add_argument("--samples", type=int, default=None, help="profile samples per repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the pipeline's)")
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="diagnostic for a shared machine (CPU, one torch thread): time the decoder's rounds by this "
        "thread's CPU time, the profile's clock, so other processes' share of the core drops out",
    )
    parser.add_argument(
        "--pair-trees",
        action="store_true",
        help="decode each pair with the tree the budget stage chose for it (budgets.json: budget and "
        "shape, as collect and evaluate do) instead of the params' tree section",
    )
    parser.add_argument(
        "--components",
        action="store_true",
        help="also split priced / measured by component (verify, mid, n-gram, decisions, tree work) "
        "and the AR baseline's steps against ar_token_ms: which part of the cost model is off",
    )
    parser.add_argument(
        "--datasets",
        nargs="*",
        default=None,
        help="check each embedded dataset on its own, on its first --prompts held-back evaluate prompts "
        "(default: one mixed set, the first question of each dataset in turn)",
    )
    parser.add_argument("--out", default="artifacts/bench/pricing.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.cpu_clock:
        if args.threads != 1:
            parser.error("--cpu-clock needs --threads 1 (other torch threads' CPU time is not counted)")
        decoder.core.decode.make_clock = lambda device: time.thread_time  # what generate times rounds with
    params = load_params(
        profile=args.overlay, overrides={"zoo": {"out_dir": args.zoo_dir}} if args.zoo_dir else None
    )
    configure_process(args.threads, params.runtime.keep_freed_memory)  # as the stages, with --threads
    s = params.profile
    names = args.pairs or [n for n in s.pairs if params.pair_paths(n)[0].exists()] or [TINY]
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, tree=TreeConfig(**params.tree.model_dump()))
    report, tables = [], []
    for name in names:
        pair = load_named(params, name)
        pair_config = replace(config, tree=pair_tree(params, name)) if args.pair_trees else config
        if args.profile_dir:
            profile = load_profile(resolve(args.profile_dir) / f"{name}.json")
        else:
            profile = measure_profile(
                pair, name, context_len=s.context_len, sizes=s.sizes, warmup=s.warmup,
                repeats=args.repeats or s.repeats, mid_tokens=s.mid_tokens, mid_fed=s.mid_fed,
                samples_per_repeat=args.samples or s.samples_per_repeat, tree_config=pair_config.tree,
                long_job_ms=s.long_job_ms,
            )  # fmt: skip
        policies: dict[str, object] = {p: p for p in args.policies}
        if args.student:
            policies["student"] = load_scheduler(args.student, pair_config.tree.depth, pair_config.tree.width)
        if args.random_student:
            policies["random-mlp"] = student_like(
                pair_config.tree.depth, pair_config.tree.width, np.random.default_rng(0)
            )
        for dataset, prompts in prompt_sets(params, name, pair, args).items():
            label = name if dataset is None else f"{name}/{dataset}"
            runtime = runtime_for(profile, sum(map(len, prompts)) / len(prompts), pair_config.tree)
            rows = check_pricing(pair, profile, prompts, policies, pair_config, runtime)
            tables.append(format_pricing(label, rows))
            print(tables[-1], flush=True)
            where = {"pair": name, "dataset": dataset}
            report += [{**where, **asdict(r), "ratio": r.ratio, "cpu_ratio": r.cpu_ratio} for r in rows]
            if args.components:
                parts = check_components(pair, profile, prompts, policies, pair_config, runtime)
                tables.append(format_components(label, parts))
                print(tables[-1], flush=True)
                report += [{**where, "components": asdict(r)} for r in parts]
    print("\n".join(tables))
    out = resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def prompt_sets(params, name: str, pair, args) -> dict[str | None, list[list[int]]]:
    """The prompts to check: one mixed set (key None), or per --datasets dataset its first --prompts
    held-back evaluate prompts."""
    if not args.datasets:
        return {None: bench_prompts(params, name, pair, args.prompts, args.max_prompt_tokens)}
    first = params.evaluate.prompt_start
    return {
        d: report_questions(params, ReportSpec(name, d, first, first + args.prompts), pair.tokenizer)[1]
        for d in args.datasets
    }


if __name__ == "__main__":
    main()
