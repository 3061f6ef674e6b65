"""The batched replay against one start at a time, side by side: collect's time and its rows.

For each pair, the same prompts of one dataset (the collect slice) are replayed with all 2^D
schedules both ways, in alternating order (one way first on even prompts, the other on odd ones):
``runtime.replay_batch_rows = 0`` (one mid forward per round start and drafting step) and batched
(every start of a prompt together, collectors/collect/forest.py). Per prompt both replays share the
continuation and the target's rows, so what differs is the mid drafter's work and the tree growing.
Prints, per pair, the seconds of the shared continuation (the target's greedy decode) and the
total replay seconds each way, their ratio with a 95% bootstrap interval over prompts, and the
equivalence check of collectors/collect/replay_check.py
(every (start, schedule) row equal or a classified near-tie, judged by the mid in fp32). Writes
``<out>.json`` and ``<out>.md``.

    .venv/bin/python benchmarks/bench_batched_replay.py --pairs zoo-l zoo-s zoo-chat-l --prompts 3
    .venv/bin/python benchmarks/bench_batched_replay.py --profile real-pair \\
        --pairs qwen2.5-coder-1.5b-0.5b --prompts 2 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

from collectors.collect.plan import load_registered_pair, pair_tree, profile_for, report_prompts
from collectors.collect.replay import Replayer
from collectors.collect.replay_check import Fp32Judge, ReplayCheck, check_prompt
from collectors.collect.report import ReportSpec
from collectors.evaluation.bootstrap import paired_interval, ratio_of_sums
from config.params import load_params
from decoder.core.config import DecodeConfig
from decoder.core.policies import schedule_bits


def timed_replay(rep: Replayer, prompt: list[int], text: list[int], limit: int) -> float:
    """Seconds of one all-schedules replay of a prompt whose continuation is known: the mid
    drafter's KV of the text (batched: its forest), the target's rows, every schedule's rounds."""
    t0 = time.perf_counter()
    rep.replay_prompt(prompt, rep.inputs_of(prompt, text, limit))
    return time.perf_counter() - t0


def bench_pair(
    params, pair_id: str, dataset: str, n_prompts: int, max_new: int, rows: int, check: bool
) -> dict:
    pair = load_registered_pair(params, pair_id)
    prompts = report_prompts(params, ReportSpec(pair_id, dataset, 0, n_prompts), pair.tokenizer)
    config = DecodeConfig(max_new, 0.0, 0, pair_tree(params, pair_id))
    schedules = [schedule_bits(s, config.tree.depth) for s in range(2**config.tree.depth)]
    profile = profile_for(params, pair_id)
    stride = params.collect.round_table_stride
    one = Replayer(pair, config, schedules, stride, profile)
    batched = Replayer(pair, config, schedules, stride, profile, batch_rows=rows)
    seconds: dict[str, list[float]] = {"continuation": [], "one": [], "batched": []}
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        g, limit = one.continuation(prompt)  # what both ways share: the target's greedy text
        seconds["continuation"].append(time.perf_counter() - t0)
        ways = [("one", one), ("batched", batched)]
        for name, rep in ways if i % 2 == 0 else ways[::-1]:
            seconds[name].append(timed_replay(rep, prompt, [*prompt, *g], limit))
    ratio = paired_interval(
        (np.asarray(seconds["one"]), np.asarray(seconds["batched"])), ratio_of_sums, 2000, 0
    )
    out = {
        "pair": pair_id, "dataset": dataset, "prompts": len(prompts), "max_new_tokens": max_new,
        "dtype": str(pair.target.dtype), "seconds": seconds, "speedup": ratio, "batch_rows": rows,
    }  # fmt: skip
    if check and pair.mid is not None:
        result = ReplayCheck()
        judge = Fp32Judge(pair.mid, pair.vocab_size)
        for prompt in prompts:
            check_prompt(Replayer(pair, config, schedules, stride, profile), batched, prompt, judge, result)
        kinds: dict[str, int] = {}
        for d in result.differences:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        out["check"] = {
            "rows": result.rows, "differing": len(result.differences),
            "share_differing": result.share_differing, "by_kind": kinds,
            "real_mismatches": len(result.real_mismatches),
            "trajectories_equal": result.equal_trajectories, "trajectories": result.trajectories,
        }  # fmt: skip
    return out


def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        point, low, high = r["speedup"]
        c = r.get("check", {})
        sec = {k: f"{sum(v):.1f}" for k, v in r["seconds"].items()}
        rows.append([
            r["pair"], r["dtype"].removeprefix("torch."), r["prompts"], sec["continuation"], sec["one"],
            sec["batched"], f"{point:.2f}x [{low:.2f}, {high:.2f}]",
            f"{c.get('differing', '-')}/{c.get('rows', '-')}" if c else "-",
            c.get("real_mismatches", "-"),
        ])  # fmt: skip
    head = ["pair", "dtype", "prompts", "continuation s", "one start at a time s", "batched s",
            "speedup [95%]", "rows differing", "real mismatches"]  # fmt: skip
    return tabulate(rows, head, tablefmt="github")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=None, help="params overlay, e.g. real-pair")
    ap.add_argument("--pairs", nargs="+", required=True)
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: collect.max_new_tokens")
    ap.add_argument("--rows", type=int, default=None, help="batch rows (default: runtime.replay_batch_rows)")
    ap.add_argument("--no-check", action="store_true", help="skip the row-by-row equivalence check")
    ap.add_argument("--out", default="artifacts/bench/batched_replay")
    args = ap.parse_args()
    params = load_params(profile=args.profile)
    torch.set_num_threads(params.runtime.torch_threads)
    rows = args.rows or params.runtime.replay_batch_rows or 512
    max_new = args.max_new_tokens or params.collect.max_new_tokens
    results = [
        bench_pair(params, p, args.dataset, args.prompts, max_new, rows, not args.no_check)
        for p in args.pairs
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    text = table(results)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
