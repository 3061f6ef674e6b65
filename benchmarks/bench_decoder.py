"""Decoder micro-benchmarks, printed side by side from one run (these machines are noisy).

1. n-gram small-step time (W frontier nodes, lookup + grafting) at 1k and 4k tokens of context,
   on token ids of real text (this Python's own standard library source, word-level ids);
2. tree-construction overhead per round, excluding model forwards, for several policies;
3. target verification of a 64-node tree versus one autoregressive step, for a tiny Qwen3;
4. host work versus context length (1k / 8k / 32k tokens): tree overhead per round outside model
   forwards (n-gram, scheduler, tree, pruning) from real decoding, KV compaction per round and the
   tree mask build per verify, each next to the old host-list / host-mask way, as ratios.

Run: `make bench` (or `.venv/bin/python benchmarks/bench_decoder.py`).
"""

from __future__ import annotations

import re
import statistics
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from decoder.config import DecodeConfig, TreeConfig
from decoder.construct import RoundBuilder
from decoder.generate import generate
from decoder.models import make_pair
from decoder.ngram import NgramDrafter
from decoder.policies import FixedSchedule
from decoder.tensors import QueryBlock, additive_mask, causal_block, compact_cache, forward_block
from decoder.timing import zero_times
from decoder.tree import DraftTree


def stdlib_token_ids(n: int, vocab: int = 4096) -> list[int]:
    """Word-level ids of real Python source; the rarest words share one id."""
    text = "".join(
        p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]
    )
    words = re.findall(r"\w+|[^\w\s]", text)
    counts: dict[str, int] = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    ids = {w: i for i, (w, _) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])[: vocab - 1])}
    return [ids.get(w, vocab - 1) for w in words[:n]]


def bench_ngram(context: int, rounds: int = 300) -> tuple[float, float]:
    """Median ms per small step and per all-small round (5 steps) over real-text contexts."""
    cfg = TreeConfig()
    tokens = stdlib_token_ids(context + rounds + 8)
    drafter = NgramDrafter(cfg.ngram_max_n, cfg.ngram_max_matches, cfg.ngram_chain_len)
    drafter.commit(tokens[:context])
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 4096, size=(len(tokens), cfg.topk)).tolist()
    logps = np.sort(rng.normal(-3, 1, size=(len(tokens), cfg.topk)))[:, ::-1].tolist()
    drafter.cache.set_rows(0, rows[: context - 1], logps[: context - 1])
    builder = RoundBuilder(cfg, drafter, None, time.perf_counter)
    schedule = FixedSchedule((False,) * cfg.depth)
    per_round, per_step = [], []
    for i in range(rounds):
        committed = tokens[: context + i]
        times = zero_times()
        t0 = time.perf_counter()
        builder.build(committed, schedule, times)
        per_round.append(time.perf_counter() - t0)
        per_step.append(times["ngram"] / cfg.depth)
        drafter.cache.set_rows(context + i - 1, [rows[context + i - 1]], [logps[context + i - 1]])
        drafter.commit([tokens[context + i]])
    return 1e3 * statistics.median(per_step), 1e3 * statistics.median(per_round)


def tiny_qwen(layers: int, hidden: int, vocab: int = 4096, positions: int = 2048) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        max_position_embeddings=positions,
    )
    return Qwen3ForCausalLM(cfg).eval()


def bench_verify_vs_ar(
    model: torch.nn.Module, context: int = 300, nodes: int = 64, reps: int = 30
) -> tuple[float, float]:
    """Median ms of one 64-node tree forward and of one single-token forward on a `context` cache."""
    prompt = list(range(1, context + 1))
    tree = DraftTree(5)
    rng = np.random.default_rng(0)
    while len(tree) < nodes + 1:
        tree.add_child(int(rng.integers(len(tree))), int(rng.integers(4096)), -1.0)
    tree_t, ar_t = [], []
    for _ in range(reps):
        cache = DynamicCache()
        forward_block(model, cache, causal_block(prompt, 0, 0))
        block = QueryBlock(list(tree.tokens), tree.positions(context), tree.ancestor_mask(), context)
        t0 = time.perf_counter()
        forward_block(model, cache, block)
        tree_t.append(time.perf_counter() - t0)
        cache.crop(-len(tree))
        t0 = time.perf_counter()
        forward_block(model, cache, causal_block([7], context, context))
        ar_t.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(tree_t), 1e3 * statistics.median(ar_t)


def bench_overhead(prompt_len: int = 200, new_tokens: int = 96) -> dict[str, float]:
    """Mean ms per round spent outside model forwards (n-gram, scheduler, tree, pruning)."""
    target = tiny_qwen(4, 256)
    mid = tiny_qwen(2, 128)
    pair = make_pair(target, mid, eos_token_ids=())
    prompt = stdlib_token_ids(prompt_len)
    out = {}
    for policy in ("all-small", "10101", "all-mid"):
        generate(pair, prompt, policy, DecodeConfig(max_new_tokens=16))
        res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=new_tokens))
        per_round = [sum(r.times[k] for k in ("ngram", "scheduler", "tree")) for r in res.rounds]
        out[policy] = 1e3 * statistics.mean(per_round)
    return out


CONTEXTS = (1024, 8192, 32768)


def bench_context_overhead(contexts=CONTEXTS, new_tokens: int = 48) -> dict[int, float]:
    """Mean ms per round outside model forwards (ngram + scheduler + tree), all-small, per context."""
    model = tiny_qwen(2, 128, positions=max(contexts) + 512)
    pair = make_pair(model, eos_token_ids=())
    text = stdlib_token_ids(max(contexts))
    text = (text * (max(contexts) // len(text) + 1))[: max(contexts)]
    out = {}
    for ctx in contexts:
        res = generate(pair, text[:ctx], "all-small", DecodeConfig(max_new_tokens=new_tokens))
        rounds = res.rounds[1:]  # the first round also fills lazily built structures
        out[ctx] = 1e3 * statistics.median(
            [sum(r.times[k] for k in ("ngram", "scheduler", "tree")) for r in rounds]
        )
    return out


def _old_compact(cache: DynamicCache, keep_prefix: int, rows: list[int]) -> None:
    """The previous compaction, for comparison: a host list of keep_prefix + rows ids per layer."""
    for layer in cache.layers:
        idx = torch.tensor(list(range(keep_prefix)) + rows, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


def _old_mask(block: QueryBlock, dtype: torch.dtype) -> torch.Tensor:
    """The previous mask: a dense [q, prefix + k] host array, then a copy."""
    q = len(block.tokens)
    visible = np.concatenate([np.ones((q, block.prefix_len), dtype=bool), block.visible], axis=1)
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~visible), torch.finfo(dtype).min)
    return mask[None, None]


def bench_context_host_work(
    contexts=CONTEXTS, layers: int = 8, kv_heads: int = 2, head_dim: int = 64, reps: int = 30
) -> dict[int, dict[str, float]]:
    """Median ms of one round's compaction (64 tree rows, 4 accepted) and one tree-mask build."""
    rng = np.random.default_rng(0)
    tree = DraftTree(5)
    while len(tree) < 64:
        tree.add_child(int(rng.integers(len(tree))), int(rng.integers(4096)), -1.0)
    out = {}
    for ctx in contexts:
        base = [torch.randn(1, kv_heads, ctx, head_dim) for _ in range(2 * layers)]
        times: dict[str, list[float]] = {"compact": [], "compact_old": [], "mask": [], "mask_old": []}
        for _ in range(reps):
            for name, fn in (("compact", compact_cache), ("compact_old", _old_compact)):
                cache = DynamicCache()
                for i in range(layers):
                    cache.update(base[2 * i], base[2 * i + 1], i)
                tail = [torch.randn(1, kv_heads, 64, head_dim) for _ in range(2)]
                for i in range(layers):
                    cache.update(*tail, i)
                rows = [ctx, ctx + 3, ctx + 9, ctx + 20]
                t0 = time.perf_counter()
                fn(cache, ctx, rows)
                times[name].append(time.perf_counter() - t0)
            block = QueryBlock(list(tree.tokens), tree.positions(ctx), tree.ancestor_mask(), ctx)
            t0 = time.perf_counter()
            additive_mask(block, torch.float32, torch.device("cpu"))
            times["mask"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _old_mask(block, torch.float32)
            times["mask_old"].append(time.perf_counter() - t0)
        out[ctx] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return out


def main() -> None:
    torch.set_num_threads(2)
    print("n-gram drafter (W=10, m=10, n<=5, chains of 4), real-text token ids")
    for ctx in (1024, 4096):
        step, rnd = bench_ngram(ctx)
        print(
            f"  context {ctx:>5}: {step:.4f} ms per small step, {rnd:.3f} ms per 5-step round "
            f"(goal < 0.1 ms per step: {'met' if step < 0.1 else 'NOT met'})"
        )
    print("\ntree-construction overhead per round, model forwards excluded (target 4x256, mid 2x128)")
    for policy, ms in bench_overhead().items():
        print(f"  {policy:<10} {ms:.3f} ms")
    print("\nhost work vs context length (tiny Qwen3 2x128 decoding; KV of 8 layers x 2 heads x 64)")
    over = bench_context_overhead()
    host = bench_context_host_work()
    lo, hi = CONTEXTS[0], CONTEXTS[-1]
    for ctx in CONTEXTS:
        h = host[ctx]
        print(
            f"  context {ctx:>5}: tree overhead {over[ctx]:.3f} ms/round, compaction {h['compact']:.3f} ms "
            f"(old {h['compact_old']:.3f}), mask {h['mask']:.3f} ms (old dense host mask {h['mask_old']:.3f})"
        )
    for name, series in (("tree overhead", over), ("compaction", {c: host[c]["compact"] for c in CONTEXTS})):
        ratio = series[hi] / series[lo]
        print(f"  {name} {hi} / {lo}: {ratio:.2f}x (goal <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
    print("\nverify a 64-node tree vs one autoregressive step (context 300)")
    for layers, hidden in ((2, 128), (4, 256), (8, 512)):
        tree_ms, ar_ms = bench_verify_vs_ar(tiny_qwen(layers, hidden))
        print(
            f"  qwen3 {layers}x{hidden:<4}: verify {tree_ms:.2f} ms, AR step {ar_ms:.2f} ms, "
            f"ratio {tree_ms / ar_ms:.2f}"
        )


if __name__ == "__main__":
    main()
