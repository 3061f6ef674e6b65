"""Stock against oneDNN linear kernels, side by side: forwards of n tokens and greedy AR decodes.

Usage (after `python -m models.real_pair`; any registered pair works):
    .venv/bin/python benchmarks/bench_linear.py [--profile real-pair]
        [--pair qwen2.5-coder-1.5b-0.5b-fp32] [--sizes 1 2 3 4 8 16] [--context 256] [--repeats 7]
        [--decode-tokens 24] [--out artifacts/bench/linear.json]

The pair's target and mid are each loaded twice in the pair's dtype (as decoder.models.pair.load_pair
loads them): with stock nn.Linear layers and with `linear: onednn` (decoder.models.onednn_linear's
OneDNNLinear: oneDNN's inner product on the layer's own weight). For each model and each n, a
forward of n tokens on a cache of --context committed tokens runs --repeats times per kernel, the
kernels alternating, the cache cropped back outside the timed part. Then each kernel's target
decodes --decode-tokens tokens greedily from the same context, twice, alternating; the outputs must
agree token for token (fp32: a kernel choice must not change what the target says). Printed: median
ms with the [min, max] spread, cost relative to that kernel's own 1-token forward (the cost curve a
tree is priced on), and the oneDNN/stock ratio. Wall clock, both cores: run it alone. The kernels'
resident memory: benchmarks/bench_linear_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoTokenizer, DynamicCache

from benchmarks.bench_mid import context_tokens
from config.params import load_params
from decoder.core.tensors import causal_block, crop_cache, forward_block
from decoder.models.pair import LINEAR_KERNELS, load_causal_lm


def time_forwards(models: dict[str, torch.nn.Module], context: list[int], sizes: list[int], repeats: int):
    """{kernel: {n: [ms per repeat]}}: n-token forwards on the context's cache, kernels alternating."""
    caches = {}
    for kernel, model in models.items():
        caches[kernel] = DynamicCache()
        forward_block(model, caches[kernel], causal_block(context, 0, 0), logits_to_keep=1)
    out = {k: {n: [] for n in sizes} for k in models}
    base = len(context)
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first round warms every shape up and is dropped
            for n in sizes:
                tokens = context[-n:]
                for kernel in models if r % 2 == 0 else reversed(list(models)):
                    t0 = time.perf_counter()
                    forward_block(models[kernel], caches[kernel], causal_block(tokens, base, base))
                    ms = (time.perf_counter() - t0) * 1e3
                    crop_cache(caches[kernel], base)
                    if r:
                        out[kernel][n].append(ms)
    return out


def decode(model: torch.nn.Module, context: list[int], n: int) -> tuple[list[int], float]:
    """Greedy KV-cached decode of n tokens after the context (one token a forward, last logits only)."""
    cache = DynamicCache()
    t0 = time.perf_counter()
    logits = forward_block(model, cache, causal_block(context, 0, 0), logits_to_keep=1)
    tokens, pos = [], len(context)
    with torch.inference_mode():
        for _ in range(n):
            tokens.append(int(logits[-1].argmax()))
            logits = forward_block(model, cache, causal_block(tokens[-1:], pos, pos), logits_to_keep=1)
            pos += 1
    return tokens, time.perf_counter() - t0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} [{min(values):.0f}, {max(values):.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="real-pair")
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b-0.5b-fp32")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/linear.json"))
    args = parser.parse_args()
    if min(args.sizes) != 1:
        parser.error("--sizes must include 1: every cost is given relative to the 1-token forward")
    params = load_params(profile=args.profile)
    if args.pair not in params.pairs:
        parser.error(f"unknown pair {args.pair!r}; the registry has {sorted(params.pairs)}")
    torch.set_num_threads(params.runtime.torch_threads)
    spec = params.pairs[args.pair]
    paths = dict(zip(("target", "mid"), params.pair_paths(args.pair), strict=True))
    tokenizer = AutoTokenizer.from_pretrained(paths["target"], local_files_only=True)
    context = context_tokens(tokenizer, args.context)
    report: dict[str, dict] = {"pair": args.pair, "dtype": spec.dtype, "context": args.context}
    print(f"{args.pair} ({spec.dtype}), {args.context}-token context, {args.repeats} repeats: "
          "median ms [min, max], x its own 1-token forward, oneDNN / stock")  # fmt: skip
    for role, path in paths.items():
        models = {k: load_causal_lm(path, spec.dtype, spec.device, linear=k) for k in LINEAR_KERNELS}
        times = time_forwards(models, context, args.sizes, args.repeats)
        report[role] = {"forward_ms": times}
        for n in args.sizes:
            cells = []
            for kernel in LINEAR_KERNELS:
                rel = statistics.median(times[kernel][n]) / statistics.median(times[kernel][1])
                cells.append(f"{kernel} {spread(times[kernel][n])} ({rel:.2f}x)")
            ratio = statistics.median(times["onednn"][n]) / statistics.median(times["stock"][n])
            print(f"  {role:<6} n={n:<3} " + "   ".join(cells) + f"   ratio {ratio:.2f}")
        if role == "target":
            walls: dict[str, list[float]] = {k: [] for k in LINEAR_KERNELS}
            outputs = {}
            for r in range(2):
                for kernel in LINEAR_KERNELS if r == 0 else reversed(LINEAR_KERNELS):
                    outputs[kernel], wall = decode(models[kernel], context, args.decode_tokens)
                    walls[kernel].append(wall)
            same = outputs["stock"] == outputs["onednn"]
            tok_s = {k: args.decode_tokens / min(v) for k, v in walls.items()}
            report["decode"] = {"tokens": args.decode_tokens, "wall_s": walls, "identical": same}
            print(f"  target AR decode of {args.decode_tokens} tokens (prefill included), best of 2: "
                  f"stock {tok_s['stock']:.2f} tok/s, onednn {tok_s['onednn']:.2f} tok/s "
                  f"({tok_s['onednn'] / tok_s['stock']:.2f}x); outputs identical: {same}")  # fmt: skip
            if not same:
                raise SystemExit("the kernels' greedy outputs differ: see the decode above")
        del models
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
