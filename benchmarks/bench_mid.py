"""What one mid-drafter call costs next to a plain KV-cached forward of the same tokens, side by side.

Usage (after the zoo stage: artifacts/zoo/<mid>/ exist):
    .venv/bin/python benchmarks/bench_mid.py [--pairs zoo-m zoo-chat-m zoo-l] [--sizes 1 8 32 100]
        [--context 256] [--repeats 30] [--out artifacts/bench/mid.json]
    .venv/bin/python benchmarks/bench_mid.py --profile real-pair --pairs qwen2.5-coder-1.5b-0.5b \
        --sizes 1 8 32 --repeats 5 --out artifacts/bench/mid_real.json   # the real pair's 0.5B mid

For each registered pair's mid model (loaded as decoder.models.pair.load_pair loads it) and each n, on
a cache of --context committed tokens (Python standard library source, tokenized), four calls
run interleaved --repeats times each, in a rotating order:
- plain: the model's own forward of n committed tokens (causal, logits_to_keep=n), as generate runs it;
- rescore: MidDrafter.rescore of a draft tree whose n nodes (root included) it has not seen yet;
- top_children: MidDrafter.top_children of the top-W frontier of that rescored tree (part of mid_step);
- mid_step: RoundBuilder.mid_step on that tree (rescore, top-W frontier, top-m children, grafting).
Each call starts from the same cache (cropped back afterwards, outside the timed part). Times are
thread CPU time with torch.set_num_threads(1), so the other jobs on this machine do not enter;
the report gives medians in ms and the ratios rescore/plain and mid_step/plain.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from tabulate import tabulate
from transformers import AutoTokenizer, DynamicCache

from config.params import load_params
from decoder.core.config import TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.mid import MidDrafter, TreeScores
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import BuildState
from decoder.core.tensors import causal_block, crop_cache, forward_block
from decoder.core.tree import DraftTree, top_w
from decoder.models.pair import load_causal_lm

PAIRS = ("zoo-m", "zoo-chat-m", "zoo-l")


def context_tokens(tokenizer, length: int) -> list[int]:
    """`length` tokens of real text: this Python's standard library source."""
    text = inspect.getsource(argparse)[: 40 * length]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < length:
        raise ValueError(f"the stdlib text gives {len(ids)} tokens, fewer than --context {length}")
    return list(ids[:length])


def random_tree(root: int, n: int, vocab: int, rng: np.random.Generator) -> DraftTree:
    """A draft tree of n nodes (root included): each node under a random earlier one."""
    tree = DraftTree(root)
    while len(tree) < n:
        parent = int(rng.integers(0, len(tree)))
        tree.add_child(parent, int(rng.integers(0, vocab)), float(-rng.exponential()))
    return tree


def plain_forward(model, cache: DynamicCache, tokens: list[int]) -> None:
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=len(tokens))


def calls_for(mid: MidDrafter, builder: RoundBuilder, tree: DraftTree, ctx: list[int], extra: list[int]):
    """name -> (setup, timed call); the setup (a fresh tree copy, a rescore) is not timed."""
    width, m = builder.config.width, builder.config.topk

    def rescored() -> list[int]:
        t = tree.copy()
        mid.rescore(t, ctx)
        return top_w(t, t.live_nodes(), width)

    return {
        "plain": (lambda: extra, lambda t: plain_forward(mid.model, mid.cache, t)),
        "rescore": (tree.copy, lambda t: mid.rescore(t, ctx)),
        "top_children": (rescored, lambda frontier: mid.top_children(frontier, m)),
        "mid_step": (lambda: BuildState(tree=tree.copy()), lambda s: builder.mid_step(s, ctx, 1)),
    }


def time_calls(calls: dict, repeats: int, mid: MidDrafter, context: int) -> dict[str, list[float]]:
    """Thread CPU seconds of each call, interleaved in a rotating order; the cache is cropped back
    to `context` entries and the round's rows dropped after each call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats + 1):  # the first pass warms up and is dropped
        for name in names[r % len(names) :] + names[: r % len(names)]:
            setup, call = calls[name]
            arg = setup()
            t0 = time.thread_time()
            call(arg)
            dt = time.thread_time() - t0
            crop_cache(mid.cache, context)
            mid.scores = TreeScores()
            if r:
                times[name].append(dt)
    return times


def bench_mid(model, tokenizer, sizes: list[int], context: int, repeats: int) -> dict[str, dict]:
    vocab = model.config.vocab_size
    ctx = context_tokens(tokenizer, context + 1)  # the last one is the round's root
    mid = MidDrafter(model, vocab)
    forward_block(model, mid.cache, causal_block(ctx[:-1], 0, 0), logits_to_keep=1)
    mid.n_committed = context
    builder = RoundBuilder(TreeConfig(), NgramDrafter(), mid, time.perf_counter)
    rng = np.random.default_rng(0)
    result = {}
    for n in sizes:
        tree = random_tree(ctx[-1], n, vocab, rng)
        extra = [int(t) for t in rng.integers(0, vocab, size=n)]
        times = time_calls(calls_for(mid, builder, tree, ctx, extra), repeats, mid, context)
        med = {name: 1e3 * float(np.median(ts)) for name, ts in times.items()}
        result[str(n)] = {
            **{f"{name}_ms": ms for name, ms in med.items()},
            "rescore_ratio": med["rescore"] / med["plain"],
            "mid_step_ratio": med["mid_step"] / med["plain"],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="params overlay, e.g. real-pair for the real pair")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 100])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="artifacts/bench/mid.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(profile=args.profile)
    result = {}
    head = ["pair", "mid", "n", "plain ms", "rescore ms", "top_children ms", "mid_step ms", "rescore/plain",
            "mid_step/plain"]  # fmt: skip
    body = []
    for pair in args.pairs:
        _, mid_path = params.pair_paths(pair)
        if mid_path is None:
            raise ValueError(f"pair {pair!r} has no mid model")
        spec = params.pairs[pair]
        model = load_causal_lm(mid_path, spec.dtype, spec.device)
        tokenizer = AutoTokenizer.from_pretrained(mid_path, local_files_only=True)
        rows = bench_mid(model, tokenizer, args.sizes, args.context, args.repeats)
        result[pair] = {"mid": str(mid_path), "context": args.context, "sizes": rows}
        body += [
            [pair, Path(mid_path).name, str(n), f"{r['plain_ms']:.3f}", f"{r['rescore_ms']:.3f}",
             f"{r['top_children_ms']:.3f}", f"{r['mid_step_ms']:.3f}", f"{r['rescore_ratio']:.2f}",
             f"{r['mid_step_ratio']:.2f}"]
            for n, r in rows.items()
        ]  # fmt: skip
    print(tabulate(body, head, tablefmt="github", disable_numparse=True))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
