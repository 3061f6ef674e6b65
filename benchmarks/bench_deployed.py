"""A pair's deployed scheduler against its baselines on held-back prompts, per dataset, wall clock.

For one pair with a deployment bundle (the deploy stage's) and evaluate's outputs, every held-back
prompt of every evaluated dataset (evaluate's cells: the same prompts it priced) is decoded by AR
and these methods in lockstep (one round of each in turn, decoder.measure.run_lockstep), ``--runs``
times, every output checked against AR's (decoder.check_lossless: in bf16 each divergence judged
by the fp32 target as a near-tie or a real mismatch):
- all-small, all-mid: the endpoints, at the bundle's tree;
- budget: the budget stage's fixed schedule for the pair (budgets.json ``decode_policy``, AR where
  it chose none);
- best-fixed: per dataset, the best fixed schedule in hindsight on these very prompts (evaluate's
  ``best-fixed`` row: hindsight no deployment can have);
- adaptive: the online adaptive rule at the thresholds the pair check chose (the bundle's);
- deployed: what the bundle deploys.
Per dataset and pooled over every prompt: each method's decoding speedup over AR (prefill excluded,
as pricing excludes it; a ratio of summed seconds over the prompts, each prompt's runs summed), the
deployed method's gain over the better endpoint, over the budget schedule and over the adaptive
rule, each a paired ratio with a 95% bootstrap interval over prompts; beside it evaluate's priced
figure of the same cell. Writes ``<out>.json`` and ``<out>.md``.

    .venv/bin/python benchmarks/bench_deployed.py --profile real-pair --pair qwen2.5-coder-1.5b-0.5b
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from collectors.collect.plan import load_registered_pair
from collectors.evaluation.bootstrap import paired_interval, ratio_of_sums
from collectors.evaluation.priced_tasks import cell_inputs
from collectors.pricing.budget_file import pair_schedule
from config.params import Params, load_params, resolve
from decoder.check_lossless import check_outputs, fp32_judge
from decoder.core.policies import AR
from decoder.deploy.deployment import Deployment, load_deployment
from decoder.measure import Method, Repeats, run_side_by_side
from decoder.models.memory import configure_process

ENDPOINTS = ("all-small", "all-mid")
GAINS = (("better endpoint", None), ("budget", "budget"), ("adaptive", "adaptive"))


@dataclass(frozen=True)
class PairBench:
    """What every dataset's cell of one pair shares, loaded once: the pair, its bundle, the budget
    stage's schedule (AR where it chose none) and the fp32 judge of its outputs."""

    pair: object
    pair_id: str
    bundle: Deployment
    budget: str
    judge: object


def pair_bench(params: Params, pair_id: str) -> PairBench:
    pair = load_registered_pair(params, pair_id)
    bundle = load_deployment(resolve(params.deploy.out_dir), pair_id)
    budget = pair_schedule(params, pair_id) or AR
    return PairBench(pair, pair_id, bundle, budget, fp32_judge(pair.target))


def methods_for(bench: PairBench, dataset: str, results: list[dict]) -> list[Method]:
    """The methods of one dataset's cell (module docstring)."""
    bundle, budget = bench.bundle, bench.budget
    cell = [r for r in results if r["pair_id"] == bench.pair_id and r["dataset_id"] == dataset]
    best = next(r["schedule"] for r in cell if r["method"] == "best-fixed")
    return [Method("all-small", "all-small"), Method("all-mid", "all-mid"), Method("budget", budget),
            Method("best-fixed", best), Method("adaptive", bundle.adaptive.name),
            Method("deployed", bundle.policy)]  # fmt: skip


def decode_seconds(runs: list) -> np.ndarray:
    """Per prompt, its runs' decoding seconds summed (prefill excluded)."""
    return np.asarray([sum(r.wall_s - r.prefill_s for r in prompt_runs) for prompt_runs in runs])


def bench_cell(params: Params, bench: PairBench, dataset: str, results: list[dict], runs: int) -> dict:
    pair = bench.pair
    n = params.evaluate.prompts_per_cell
    _, prompts, _, runtimes = cell_inputs(params, bench.pair_id, dataset, pair, n)
    methods = methods_for(bench, dataset, results)
    every: dict[str, list] = {}
    out = run_side_by_side(pair, prompts, methods, bench.bundle.config, runtimes, timing=False,
                           repeats=Repeats(1e9, runs), every_run=every, lockstep=True)  # fmt: skip
    refs = [r.new_tokens for r in out[AR]]
    lossless = {}
    for m in methods:
        outputs = [r.new_tokens for r in out[m.name]]
        rep = check_outputs(bench.judge, prompts, refs, outputs, pair.target.dtype)
        lossless[m.name] = {"identical": sum(c.identical for c in rep.checks), "near_ties": rep.n_near_ties,
                            "real_mismatches": rep.n_real_mismatches}  # fmt: skip
    seconds = {name: decode_seconds(r).tolist() for name, r in every.items()}
    schedules = {m.name: m.policy if isinstance(m.policy, str) else m.name for m in methods}
    return {"dataset": dataset, "prompts": len(prompts), "runs": runs, "seconds": seconds,
            "schedules": schedules, "lossless": lossless}  # fmt: skip


def speedups(cells: list[dict]) -> dict:
    """Per method, the decoding speedup over AR pooled over the cells' prompts, and the deployed
    method's paired gains (module docstring), each [point, low, high]."""
    sec = {m: np.concatenate([np.asarray(c["seconds"][m]) for c in cells]) for m in cells[0]["seconds"]}
    out = {m: list(paired_interval((sec[AR], s), ratio_of_sums, 2000, 0)) for m, s in sec.items() if m != AR}
    better = min(ENDPOINTS, key=lambda m: sec[m].sum())
    for label, other in GAINS:
        out[f"deployed vs {label}"] = list(
            paired_interval((sec[other or better], sec["deployed"]), ratio_of_sums, 2000, 0)
        )
    out["better endpoint"] = better
    return out


def _x(v: list[float]) -> str:
    return f"{v[0]:.2f}x [{v[1]:.2f}, {v[2]:.2f}]"


def table(rows: list[dict], priced: dict) -> str:
    """One line per dataset and a pooled one (every row carries its ``speedups``)."""
    names = ["all-small", "all-mid", "budget", "best-fixed", "adaptive", "deployed"]
    head = ["dataset", "prompts x runs", *names, "deployed vs better end", "vs budget", "vs adaptive",
            "deployed priced", "outputs vs AR (deployed)"]  # fmt: skip
    body = []
    for c in rows:
        s = c["speedups"]
        lossless = c.get("lossless", {}).get("deployed", {})
        body.append([c["dataset"], f"{c['prompts']} x {c['runs']}", *(_x(s[n]) for n in names),
                     *(_x(s[f"deployed vs {label}"]) for label, _ in GAINS),
                     f"{priced[c['dataset']]:.2f}x" if c["dataset"] in priced else "-",
                     f"{lossless['identical']} identical, {lossless['near_ties']} near-ties, "
                     f"{lossless['real_mismatches']} real" if lossless else "-"])  # fmt: skip
    return tabulate(body, head, tablefmt="github", disable_numparse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=None, help="params overlay, e.g. real-pair")
    ap.add_argument("--pair", required=True)
    ap.add_argument("--datasets", nargs="*", default=None, help="default: evaluate.datasets")
    ap.add_argument("--runs", type=int, default=2, help="lockstep runs of every prompt")
    ap.add_argument("--out", default="artifacts/bench/deployed")
    args = ap.parse_args()
    params = load_params(profile=args.profile)
    configure_process(params.runtime.torch_threads, params.runtime.keep_freed_memory)
    results = json.loads((resolve(params.evaluate.out_dir) / "results.json").read_text())["main"]
    bench = pair_bench(params, args.pair)
    cells = []
    for dataset in args.datasets or params.evaluate.datasets:
        cell = bench_cell(params, bench, dataset, results, args.runs)
        cell["speedups"] = speedups([cell])
        cells.append(cell)
        print(f"{dataset}: deployed {_x(cell['speedups']['deployed'])} over AR", flush=True)
    keys = ("identical", "near_ties", "real_mismatches")
    lossless = {m: {k: sum(c["lossless"][m][k] for c in cells) for k in keys} for m in cells[0]["lossless"]}
    pooled = {"dataset": "pooled", "prompts": sum(c["prompts"] for c in cells), "runs": args.runs,
              "speedups": speedups(cells), "lossless": lossless}  # fmt: skip
    priced = {r["dataset_id"]: r["priced_speedup"] for r in results
              if r["pair_id"] == args.pair and r["method"] == "deployed"}  # fmt: skip
    cells_out = [*cells, pooled]
    text = table(cells_out, priced)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"pair": args.pair, "cells": cells_out}, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
