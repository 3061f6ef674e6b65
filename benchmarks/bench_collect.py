"""Replay vs execute collection, side by side in one run, on the embedded default.

For one report (a zoo pair x a dataset x a few prompts) it runs all 2^D schedules in execute mode
(real target verification every round) and in replay mode, prints both wall times, the ratio
(goal: replay >= 3x faster) and checks that every trajectory's accepted lengths are identical.

Run after `make repro` (needs the data, zoo and profile stages):
    .venv/bin/python benchmarks/bench_collect.py --dataset humaneval --prompts 2   # every collect pair
"""

from __future__ import annotations

import argparse
import time

import torch

from collectors.collect.execute import execute_prompt
from collectors.collect.plan import load_registered_pair, report_prompts, tree_config
from collectors.collect.replay import Replayer
from collectors.collect.report import ReportSpec
from config.params import load_params
from decoder.core.config import DecodeConfig
from decoder.core.policies import schedule_bits


def bench_pair(
    params, name: str, dataset: str, n_prompts: int, max_new: int, stride: int
) -> tuple[float, float]:
    """Execute and replay one report side by side; returns (execute s, replay s)."""
    pair = load_registered_pair(params, name)
    prompts = report_prompts(params, ReportSpec(name, dataset, 0, n_prompts), pair.tokenizer)
    config = DecodeConfig(max_new, 0.0, 0, tree_config(params.tree))
    schedules = [schedule_bits(s, config.tree.depth) for s in range(2**config.tree.depth)]
    execute_prompt(pair, prompts[0], schedules[-1], DecodeConfig(8, 0.0, 0, config.tree))  # warm-up

    t0 = time.perf_counter()
    executed = {(p, s): execute_prompt(pair, prompt, bits, config)
                for p, prompt in enumerate(prompts) for s, bits in enumerate(schedules)}  # fmt: skip
    t_exec = time.perf_counter() - t0
    t0 = time.perf_counter()
    replayer = Replayer(pair, config, schedules, stride)
    replayed = [replayer.replay_prompt(prompt) for prompt in prompts]
    t_replay = time.perf_counter() - t0

    same = sum(
        [r.accepted for r in executed[p, s][0]] == [r.accepted for r in replayed[p].rounds[s]]
        for p in range(len(prompts))
        for s in range(len(schedules))
    )
    rounds = sum(len(executed[k][0]) for k in executed)
    print(f"{name} x {dataset}: {len(prompts)} prompts x {len(schedules)} schedules, {max_new} new tokens")
    print(f"  execute: {t_exec:8.2f} s  ({rounds} rounds verified by the target)")
    table_starts = sum(len(r.starts) for r in replayed)
    print(f"  replay : {t_replay:8.2f} s  (no verify; round table: {table_starts} starts, stride {stride})")
    print(f"  replay speedup: {t_exec / t_replay:.2f}x; identical accepted lengths: {same}/{len(executed)}")
    return t_exec, t_replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default=None, help="comma-separated; default: collect.pairs")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--profile", default=None, help="params profile, e.g. smoke")
    ap.add_argument("--stride", type=int, default=None, help="round-table stride (default: params)")
    args = ap.parse_args()
    params = load_params(profile=args.profile)
    torch.set_num_threads(params.runtime.torch_threads)
    pairs = args.pairs.split(",") if args.pairs else list(params.collect.pairs)
    stride = params.collect.round_table_stride if args.stride is None else args.stride
    max_new = args.max_new_tokens or params.collect.max_new_tokens
    totals = [bench_pair(params, p, args.dataset, args.prompts, max_new, stride) for p in pairs]
    t_exec, t_replay = sum(t for t, _ in totals), sum(t for _, t in totals)
    ratio = t_exec / t_replay
    print(
        f"all pairs: execute {t_exec:.2f} s, replay {t_replay:.2f} s: replay {ratio:.2f}x faster (goal >= 3x)"
    )


if __name__ == "__main__":
    main()
