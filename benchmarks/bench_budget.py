"""Budget sweep: priced speedup over AR of All-Small and All-Mid under every verification budget.

Usage (after `make repro`: the zoo and artifacts/profile/<pair>.json exist):
    .venv/bin/python benchmarks/bench_budget.py [--pairs zoo-s zoo-l] [--prompts 2]
        [--max-new-tokens 48] [--out artifacts/bench/budget.json]

Per pair and prompt, replay (collectors.pricing.budget_sweep, the sweep the budget stage runs; temperature
0, exact) builds each round's full tree once per fixed schedule; decoder.core.budget.budget_sweep turns
its one greedy acceptance into the accepted length and verified size under every budget B <= 63.
Every budget's trajectory is then walked start to start (L -> L + A_B + 1) with replay's own round
accounting (`Walk`), and priced with the pair's profile (fixed schedules: no decision cost), so
each B is an exact replay of decoding with `TreeConfig.budget = B`. Columns:
- B in {1, 2, 4, 8, 16, 32, 63}: priced tokens/s over AR's (priced as one-token target steps).
- saba: the paper's rule, B = c_fixed / c_verify of the line fitted to the round cost
  C(B) = mean drafting + tree work + the profile's verify(B + 1), B in 1..63, over the rounds of
  the B = 63 trajectory (today's default: what one verification of the largest tree records).
- fitted: decoder.core.budget.best_budget, argmax (E[A](B) + 1) / C(B), with E[A](B) and C(B) the
  means under B over those same rounds (accepted tokens capped at what is left to emit).
- per-token: argmin over B of the mean, over EVERY start position of the continuation, of
  C_B / tokens_B (each token charged its share of the round starting at it). The B = 63
  trajectory's starts are a biased sample for a smaller budget, whose trajectory spends more
  rounds inside long accepted runs; every position is not.
- best: the best B in 1..63 in hindsight (the speed the budget holds).
All three rules are in sample (they saw these prompts). --check replays the first prompt again
with plain collectors.collect.replay at every grid budget and requires identical rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
from tabulate import tabulate

from benchmarks.pair_sources import bench_prompts, load_named
from collectors.collect.plan import tree_config
from collectors.collect.replay import Replayer
from collectors.collect.trajectory import Walk
from collectors.pricing.budget_sweep import (
    PolicySweep,
    Sample,
    SweepReplayer,
    round_counts,
    round_tokens,
    sweep_pair,
)
from config.params import load_params, resolve
from decoder.core.budget import best_budget
from decoder.core.config import TreeConfig
from decoder.deploy.latency import LatencyProfile, load_profile, price_round
from decoder.models.pair import ModelPair

log = logging.getLogger("bench_budget")
GRID = (1, 2, 4, 8, 16, 32, 63)
COUNT_FIELDS = ("accepted", "emitted", "verified_nodes", "mid_tree_tokens", "mid_catch_up", "small_steps",
                "tree_nodes", "small_frontier", "mid_lag", "prompt_blocks")  # fmt: skip


def check_against_replay(rep: SweepReplayer, prompt: list[int], walks: dict[tuple[int, int], Walk]) -> None:
    """The sweep's trajectory under each grid budget equals a plain replay run with that budget."""
    for b in GRID:
        plain = Replayer(
            rep.pair, replace(rep.config, tree=replace(rep.config.tree, budget=b)), rep.schedules
        )
        got = plain.replay_prompt(prompt)
        for s in range(len(rep.schedules)):
            want = [tuple(getattr(r, f) for f in COUNT_FIELDS) for r in got.rounds[s]]
            have = [tuple(getattr(r, f) for f in COUNT_FIELDS) for r in walks[s, b].rounds]
            if want != have:
                raise RuntimeError(f"budget {b}, schedule {s}: sweep {have[:3]}... != replay {want[:3]}...")
    log.info("check: the sweep equals plain replay at budgets %s", GRID)


def pair_sweep(pair: ModelPair, profile: LatencyProfile, prompts: list[list[int]], tree: TreeConfig,
               max_new: int, check: bool = False) -> dict:  # fmt: skip
    b_max = max(GRID)
    sweeps = sweep_pair(pair, profile, prompts, replace(tree, budget=b_max), max_new,
                        check_against_replay if check else None)  # fmt: skip
    return {name: rules(profile, sw) for name, sw in sweeps.items()}


def rules(profile: LatencyProfile, sw: PolicySweep) -> dict:
    """The grid, the three rules and the best budget in hindsight of one policy's sweep."""
    budgets = list(sw.budgets)
    fitted = fitted_rule(profile, sw.on_max, budgets)
    saba, c_verify, c_fixed = sw.saba(profile)
    per_token = per_token_rule(profile, sw.every, budgets)
    best = sw.best()
    return {
        "speedup": {str(b): sw.speedup(b) for b in GRID},
        "accepted": {str(b): sw.accepted[b - 1] for b in GRID},
        "saba": {"budget": saba, "speedup": sw.speedup(saba), "c_verify_ms": c_verify, "c_fixed_ms": c_fixed},
        "fitted": {"budget": fitted, "speedup": sw.speedup(fitted)},
        "per_token": {"budget": per_token, "speedup": sw.speedup(per_token)},
        "best": {"budget": best, "speedup": sw.speedup(best), "accepted": sw.accepted[best - 1]},
        "all_speedups": [sw.speedup(b) for b in budgets],
    }


def fitted_rule(profile: LatencyProfile, samples: list[Sample], budgets: list[int]) -> int:
    """On the rounds of the largest tree's trajectory (one verification each gives every budget):
    decoder.core.budget.best_budget over E[A](B) and the mean priced round C(B)."""
    gain = [np.mean([round_tokens(o, left, b) for o, left in samples]) - 1.0 for b in budgets]
    cost = np.maximum.accumulate([np.mean([price_round(profile, round_counts(o, b)) for o, _ in samples])
                                  for b in budgets])  # fmt: skip
    return best_budget(budgets, gain, cost)


def per_token_rule(profile: LatencyProfile, samples: list[Sample], budgets: list[int]) -> int:
    """argmin over B of the mean over every start position of C_B / tokens_B: each token is charged
    its share of the round that starts at it, so no budget's own trajectory weights the sample."""
    per_token = [np.mean([price_round(profile, round_counts(o, b)) / round_tokens(o, left, b)
                          for o, left in samples]) for b in budgets]  # fmt: skip
    return budgets[int(np.argmin(per_token))]


def markdown(results: dict[str, dict]) -> str:
    head = ["pair", "policy", *(f"B={b}" for b in GRID), "saba (B)", "fitted (B)", "per-token (B)",
            "best (B)", "best / B=63"]  # fmt: skip
    body = []
    for pair, rows in results.items():
        for name, r in rows.items():
            cells = [f"{r['speedup'][str(b)]:.2f}x" for b in GRID]
            picks = ("saba", "fitted", "per_token", "best")
            pick = [f"{r[k]['speedup']:.2f}x ({r[k]['budget']})" for k in picks]
            gain = r["best"]["speedup"] / r["speedup"]["63"]
            body.append([pair, name, *cells, *pick, f"{gain:.2f}"])
    return tabulate(body, head, tablefmt="github", disable_numparse=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default=None, help="params overlay (profiles/NAME.yaml)")
    parser.add_argument("--pairs", nargs="*", default=None, help="registered pairs (default: all built)")
    parser.add_argument("--profile-dir", default="artifacts/profile")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--check", action="store_true", help="first prompt: compare with plain replay")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="artifacts/bench/budget.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    params = load_params(profile=args.overlay)
    names = args.pairs or [n for n in params.profile.pairs if params.pair_paths(n)[0].exists()]
    tree = tree_config(params.tree)
    results = {}
    for name in names:
        t0 = time.perf_counter()
        pair = load_named(params, name)
        profile = load_profile(resolve(args.profile_dir) / f"{name}.json")
        prompts = bench_prompts(params, name, pair, args.prompts, args.max_prompt_tokens)
        results[name] = pair_sweep(pair, profile, prompts, tree, args.max_new_tokens, args.check)
        log.info("%s: %.1f s", name, time.perf_counter() - t0)
    table = markdown(results)
    print(table)
    out = resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
