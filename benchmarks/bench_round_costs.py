"""Where a speculative decode's time goes, against AR, prompt by prompt (wall clock, one process).

Usage (after `python -m models.real_pair` for the real pair; any registered pair works):
    .venv/bin/python benchmarks/bench_round_costs.py [--profile real-pair]
        [--pair qwen2.5-coder-1.5b-0.5b-fp32] [--datasets alpaca gsm8k] [--prompts-per-dataset 2]
        [--max-new-tokens 32] [--policy all-small] [--budget 12] [--width 2] [--topk 2]
        [--ngram-min-n 2]

Prompts: the held-back questions from evaluate.prompt_start on, as bench_real_pair.py takes them.
Each prompt is decoded by AR and then by the policy (greedy, checked identical; in bf16 or fp16 a
divergence is judged by the target in fp32, `decoder.check_lossless`: a near-tie is printed and the
run goes on, a real mismatch stops it), back to back after one shared warm-up. Printed per prompt:
both walls and their ratio; both prefills (both keep the last position's logits only; the
speculative decode computes a prompt position's top-m row, 16 positions at a time, when its n-gram
drafter first reads it, inside the rounds), and what the rows of every prompt position cost on
their own (timed after the decodes: what the prefill paid for them before they were computed on
demand); the speculative rounds split into root-only rounds (no draft:
one target step) and rounds that verified a tree, with their median verify ms and accepted tokens;
and AR's decode ms per step and its step count. What it answers: whether a slowdown against AR comes
from failed drafts (tree rounds that accept nothing), from the prompt's rows, or from root-only
rounds costing more than an AR step. Both prefills run the whole prompt and yield the first new
token, so the rounds and AR's steps cover the same tokens. Timing-sensitive: run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from benchmarks.bench_real_pair import held_back_prompts
from collectors.collect.plan import tree_config
from config.params import load_params
from decoder.check_lossless import compare, fp32_judge
from decoder.core.config import DecodeConfig
from decoder.core.decode import autoregressive
from decoder.core.outcome import GenerationResult
from decoder.core.timing import make_clock
from decoder.core.verify import TargetVerifier
from decoder.generate import generate
from decoder.models.pair import load_pair


def rounds_line(res: GenerationResult) -> str:
    """Root-only rounds and tree rounds of one decode: count, median verify ms, accepted tokens."""
    root = [r.times["verify"] * 1e3 for r in res.rounds if r.verified_size == 0]
    tree = [r for r in res.rounds if r.verified_size > 0]
    tree_ms = statistics.median(r.times["verify"] * 1e3 for r in tree) if tree else 0.0
    failed = sum(r.accepted == 0 for r in tree)
    return (
        f"root-only {len(root)} ({statistics.median(root) if root else 0.0:.0f} ms), tree {len(tree)} "
        f"({tree_ms:.0f} ms, {sum(r.accepted for r in tree)} accepted, {failed} accepted nothing)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="real-pair")
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b-0.5b-fp32")
    parser.add_argument("--datasets", nargs="+", default=["alpaca", "gsm8k"])
    parser.add_argument("--prompts-per-dataset", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--policy", default="all-small")
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--width", type=int, default=2)
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--ngram-min-n", type=int, default=2)
    args = parser.parse_args()
    params = load_params(profile=args.profile)
    if args.pair not in params.pairs:
        parser.error(f"unknown pair {args.pair!r}; the registry has {sorted(params.pairs)}")
    torch.set_num_threads(params.runtime.torch_threads)
    spec = params.pairs[args.pair]
    target, mid = params.pair_paths(args.pair)
    pair = load_pair(target, mid, dtype=spec.dtype, device=spec.device, linear=spec.linear)
    datasets, prompts = held_back_prompts(
        params, pair.tokenizer, spec.template, args.datasets, args.prompts_per_dataset
    )
    tree = dataclasses.replace(
        tree_config(params.tree), budget=args.budget, width=args.width, topk=args.topk,
        ngram_min_n=args.ngram_min_n,
    )  # fmt: skip
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, tree=tree)
    warm = dataclasses.replace(config, max_new_tokens=min(8, args.max_new_tokens))
    autoregressive(pair, prompts[0], warm)
    generate(pair, prompts[0], args.policy, warm)
    print(f"{args.pair}, {args.policy} at B = {args.budget}, {args.width} x {args.topk}, "
          f"n-gram n >= {args.ngram_min_n}, {args.max_new_tokens} new tokens")  # fmt: skip
    clock = make_clock(pair.target.device)
    judge = None  # the target in fp32, built the first time a bf16/fp16 output differs from AR's
    for ds, prompt in zip(datasets, prompts, strict=True):
        ar = autoregressive(pair, prompt, config)
        res = generate(pair, prompt, args.policy, config, timing=True)
        tie = ""
        if res.new_tokens != ar.new_tokens:  # fp32: a real mismatch; bf16/fp16: judged in fp32
            judge = judge or fp32_judge(pair.target)
            check = compare(judge, prompt, ar.new_tokens, res.new_tokens, pair.target.dtype)
            first = (check.real_mismatches or check.divergences)[0]
            where = f"new token {first.position}: gap {first.gap:.3g}"
            if check.real_mismatches:
                raise SystemExit(f"{ds}: the {args.policy} output differs from AR's at {where} > "
                                 f"{first.tolerance:.3g}, not a near-tie")  # fmt: skip
            tie = f" [near-tie at {where} <= {first.tolerance:.3g}]"
        ar_step = (ar.wall_s - ar.prefill_s) * 1e3 / max(1, len(ar.new_tokens) - 1)
        head = TargetVerifier(pair.target, pair.vocab_size, tree.topk).prefill(prompt)
        t0 = clock()
        head.rows.all()  # every prompt position's row, as the prefill computed them before
        rows_s = clock() - t0
        print(
            f"{ds:<10} {len(prompt):>4} prompt tokens, {len(ar.new_tokens):>3} new: wall AR "
            f"{ar.wall_s:.2f} s, {args.policy} {res.wall_s:.2f} s ({ar.wall_s / res.wall_s:.3f}x); "
            f"prefill AR {ar.prefill_s:.2f} s, spec {res.prefill_s:.2f} s (every prompt row: "
            f"{rows_s:.2f} s more); AR step {ar_step:.0f} ms "
            f"x {len(ar.new_tokens) - 1}; {len(res.rounds)} rounds: {rounds_line(res)}{tie}"
        )


if __name__ == "__main__":
    main()
