"""Decoder micro-benchmarks, printed side by side from one run (these machines are noisy).

1. n-gram small-step time (W frontier nodes, lookup + grafting) at 1k and 4k tokens of context,
   on token ids of real text (this Python's own standard library source, word-level ids);
2. tree-construction overhead per round, excluding model forwards, for several policies;
3. target verification of a 64-node tree versus one autoregressive step, for a tiny Qwen3;
4. host work versus context length (1k / 8k / 32k tokens): tree overhead per round outside model
   forwards (n-gram, scheduler, tree, pruning) and KV compaction per round, from the real decoding
   loop on real text with the target's forward replaced by the text's own next tokens (so every
   context drafts and accepts the same continuation: the work per round is the same, only the
   context differs); then compaction and the tree mask build in isolation, each next to the old
   host-list / host-mask way; ratios 32k / 1k.

Run: `make bench` (or `.venv/bin/python benchmarks/bench_decoder.py [--part 4]`).
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

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.decode import _speculative
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import FixedSchedule, parse_policy
from decoder.core.tensors import (
    ROW_BLOCK,
    QueryBlock,
    additive_mask,
    block_start,
    causal_block,
    compact_cache,
    forward_block,
)
from decoder.core.timing import zero_times
from decoder.core.tree import DraftTree
from decoder.core.verify import Prefill, TopLogps, Verdict
from decoder.generate import generate
from decoder.models.pair import make_pair


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
    drafter = NgramDrafter.for_tree(cfg)
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


class TextRows:
    """The prompt's rows as the real prefill hands them to the loop (decoder.core.verify.PromptRows: a
    block of ROW_BLOCK positions, aligned to position 0, when first read), cut from precomputed
    lists instead of an output head."""

    def __init__(self, tokens: list[list[int]], logps: list[list[float]]) -> None:
        self.tokens, self.logps = tokens, logps
        self.start = 0
        self.count = len(tokens)

    def block(self, position: int) -> TopLogps:
        lo = block_start(position)
        return TopLogps(lo, self.tokens[lo : lo + ROW_BLOCK], self.logps[lo : lo + ROW_BLOCK])


class TextVerifier:
    """Stands in for the target in the real speculative loop: no forward, the text's own next
    tokens as the target's greedy choice. The KV cache is a real DynamicCache of `layers` x
    `kv_heads` x `head_dim` that grows by the tree's rows per round (the forward's work, untimed),
    and is compacted by the real compact_cache, timed into `compact_s` in the rounds where rows move
    (the others only crop: a median over both kinds would flip between them).

    A real target forward streams its weights and the whole KV cache through the CPU caches, so the
    host work after it starts cold at any context. A forward that costs nothing would leave a 1k
    context's host data warm and a 32k one's evicted (by the cache growth alone) and time the CPU
    cache instead of the code: each "forward" therefore also streams `flush_mb` MB (more than this
    machine's 32 MiB L3), the same amount at every context."""

    def __init__(
        self,
        text: list[int],
        topk: int,
        layers: int = 8,
        kv_heads: int = 2,
        head_dim: int = 64,
        flush_mb: int = 96,
        row_span: int | None = None,
    ):
        self.text = text
        self.flush = torch.ones(flush_mb << 18)  # float32: flush_mb MB
        self.shape = (1, kv_heads, head_dim)
        self.layers = layers
        self.cache = DynamicCache()
        # The target's rows are drawn for `row_span` positions and the text takes the last of them: texts
        # that end at the same point (the contexts of bench_context_rounds) share the rows of every
        # position they share, so the same continuation drafts the same trees.
        span = max(row_span or 0, len(text))
        rng = np.random.default_rng(0)
        self.rows = rng.integers(0, 4096, size=(span, topk))[span - len(text) :].tolist()
        logps = np.sort(rng.normal(-3, 1, size=(span, topk)))[:, ::-1]
        self.logps = logps[span - len(text) :].tolist()
        self.compact_s: list[float] = []

    def _grow(self, n: int) -> None:
        b, h, d = self.shape
        for i in range(self.layers):
            self.cache.update(torch.zeros(b, h, n, d), torch.zeros(b, h, n, d), i)
        self.flush.add_(1.0)  # read and write every byte

    def prefill(self, prompt: list[int]) -> Prefill:
        n = len(prompt)
        self._grow(n)
        logits = torch.zeros(max(self.text) + 1)
        logits[self.text[n]] = 1.0  # the continuation's first token, as the target would pick it
        return Prefill(TextRows(self.rows[:n], self.logps[:n]), logits)

    def verify(self, tree: DraftTree, temperature: float, rng: np.random.Generator) -> Verdict:
        prefix = self.cache.get_seq_length()
        self._grow(len(tree))
        target_next = [self.text[prefix + 1 + d] for d in tree.depths]
        accepted = tree.greedy_accept(target_next)
        t0 = time.perf_counter()
        compact_cache(self.cache, prefix, [prefix + r for r in (0, *accepted)])
        if list(accepted) != list(range(1, len(accepted) + 1)):
            self.compact_s.append(time.perf_counter() - t0)
        keep = slice(prefix, prefix + len(accepted) + 1)
        return Verdict(
            accepted,
            target_next[accepted[-1] if accepted else 0],
            TopLogps(prefix, self.rows[keep], self.logps[keep]),
        )


def bench_context_rounds(
    contexts=CONTEXTS, window: int | None = 1024, new_tokens: int = 160, reps: int = 3
) -> dict[int, dict[str, float]]:
    """Per round, ms outside forwards (ngram + scheduler + tree) and ms of KV compaction where rows
    move, all-small.

    The real loop (decoder.core.decode._speculative) runs on real text; a TextVerifier replaces the
    target's forward. Every context ends at the same point of the text, so each decodes the same
    continuation. With `window`, only the last `window` context tokens keep their ids and the text
    before them is remapped to ids of its own (shifted by the vocabulary), so every context drafts
    the very same trees and only the amount of context held differs; with None the whole context
    is plain text (a longer one offers more matches, so fuller trees). Contexts are interleaved,
    medians are over every round of `reps` runs; also the mean drafted nodes and A per round.
    """
    vocab = 4096
    need = max(contexts) + new_tokens + 64
    text = stdlib_token_ids(need, vocab)
    if len(text) < need:
        raise RuntimeError(f"only {len(text)} words of stdlib text, {need} needed")
    cut = max(contexts)
    model = tiny_qwen(1, 64, vocab=2 * vocab, positions=need + 64)
    pair = make_pair(model, eos_token_ids=())
    config = DecodeConfig(max_new_tokens=new_tokens)
    schedule = parse_policy("all-small", config.tree.depth)
    keys = ("over", "compact", "nodes", "A")
    samples: dict[int, dict[str, list[float]]] = {c: {k: [] for k in keys} for c in contexts}
    for _ in range(reps):
        for ctx in contexts:
            start = cut - ctx if window is None else cut - min(window, ctx)
            text_l = [t + vocab for t in text[cut - ctx : start]] + text[start:]
            verifier = TextVerifier(text_l, config.tree.topk, row_span=len(text))
            res = _speculative(pair, text_l[:ctx], schedule, config, None, True, verifier)
            s = samples[ctx]
            s["over"] += [sum(r.times[k] for k in ("ngram", "scheduler", "tree")) for r in res.rounds]
            s["compact"] += verifier.compact_s
            s["nodes"] += [r.tree_size for r in res.rounds]
            s["A"] += [r.accepted for r in res.rounds]
    return {
        c: {
            "over": 1e3 * statistics.median(s["over"]),
            "compact": 1e3 * statistics.median(s["compact"]) if s["compact"] else float("nan"),
            "nodes": statistics.mean(s["nodes"]),
            "A": statistics.mean(s["A"]),
        }
        for c, s in samples.items()
    }


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
    """Median ms of one round's compaction (64 tree rows, 4 accepted) and one tree-mask build,
    each next to the old way; contexts interleaved within each repetition (a noisy machine)."""
    rng = np.random.default_rng(0)
    tree = DraftTree(5)
    while len(tree) < 64:
        tree.add_child(int(rng.integers(len(tree))), int(rng.integers(4096)), -1.0)
    base = {ctx: [torch.randn(1, kv_heads, ctx, head_dim) for _ in range(2 * layers)] for ctx in contexts}
    times = {ctx: {"compact": [], "compact_old": [], "mask": [], "mask_old": []} for ctx in contexts}
    for _ in range(reps):
        for ctx in contexts:
            for name, fn in (("compact", compact_cache), ("compact_old", _old_compact)):
                cache = DynamicCache()
                for i in range(layers):
                    cache.update(base[ctx][2 * i], base[ctx][2 * i + 1], i)
                tail = [torch.randn(1, kv_heads, 64, head_dim) for _ in range(2)]
                for i in range(layers):
                    cache.update(*tail, i)
                rows = [ctx, ctx + 3, ctx + 9, ctx + 20]
                t0 = time.perf_counter()
                fn(cache, ctx, rows)
                times[ctx][name].append(time.perf_counter() - t0)
            block = QueryBlock(list(tree.tokens), tree.positions(ctx), tree.ancestor_mask(), ctx)
            t0 = time.perf_counter()
            additive_mask(block, torch.float32, torch.device("cpu"))
            times[ctx]["mask"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _old_mask(block, torch.float32)
            times[ctx]["mask_old"].append(time.perf_counter() - t0)
    return {ctx: {k: 1e3 * statistics.median(v) for k, v in t.items()} for ctx, t in times.items()}


def part_ngram() -> None:
    print("n-gram drafter (W=10, m=10, n<=5, chains of 4), real-text token ids")
    for ctx in (1024, 4096):
        step, rnd = bench_ngram(ctx)
        print(
            f"  context {ctx:>5}: {step:.4f} ms per small step, {rnd:.3f} ms per 5-step round "
            f"(goal < 0.1 ms per step: {'met' if step < 0.1 else 'NOT met'})"
        )


def part_overhead() -> None:
    print("tree-construction overhead per round, model forwards excluded (target 4x256, mid 2x128)")
    for policy, ms in bench_overhead().items():
        print(f"  {policy:<10} {ms:.3f} ms")


def part_verify() -> None:
    print("verify a 64-node tree vs one autoregressive step (context 300)")
    for layers, hidden in ((2, 128), (4, 256), (8, 512)):
        tree_ms, ar_ms = bench_verify_vs_ar(tiny_qwen(layers, hidden))
        print(
            f"  qwen3 {layers}x{hidden:<4}: verify {tree_ms:.2f} ms, AR step {ar_ms:.2f} ms, "
            f"ratio {tree_ms / ar_ms:.2f}"
        )


def part_context() -> None:
    print(
        "host work vs context length: the all-small loop on real text, target forward replaced by the\n"
        "text's own next tokens (same continuation at every context; KV of 8 layers x 2 heads x 64)"
    )
    lo, hi = CONTEXTS[0], CONTEXTS[-1]

    def ratio(name: str, values: dict[int, float]) -> None:
        r = values[hi] / values[lo]
        print(f"    {name} {hi} / {lo}: {r:.2f}x (goal <= 1.5x: {'met' if r <= 1.5 else 'NOT met'})")

    for label, window in (
        ("same last 1024 tokens, earlier text on ids of its own", 1024),
        ("plain text", None),
    ):
        print(f"  {label}:")
        rounds = bench_context_rounds(window=window)
        for ctx in CONTEXTS:
            r = rounds[ctx]
            print(
                f"    context {ctx:>5}: tree overhead {r['over']:.3f} ms/round, compaction "
                f"{r['compact']:.3f} ms/moving round ({r['nodes']:.1f} drafted nodes, A {r['A']:.2f})"
            )
        ratio("tree overhead", {c: rounds[c]["over"] for c in CONTEXTS})
        ratio("compaction", {c: rounds[c]["compact"] for c in CONTEXTS})
    print("  in isolation (64 tree rows, 4 accepted; a 64-node tree mask):")
    host = bench_context_host_work()
    for ctx in CONTEXTS:
        h = host[ctx]
        print(
            f"    context {ctx:>5}: compaction {h['compact']:.3f} ms (old host list {h['compact_old']:.3f}), "
            f"mask {h['mask']:.3f} ms (old dense host mask {h['mask_old']:.3f})"
        )
    ratio("compaction", {c: host[c]["compact"] for c in CONTEXTS})


PARTS = {"1": part_ngram, "2": part_overhead, "3": part_verify, "4": part_context}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--part", action="append", choices=sorted(PARTS), help="run only these parts (repeatable)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    for i, key in enumerate(args.part or sorted(PARTS)):
        if i:
            print()
        PARTS[key]()


if __name__ == "__main__":
    main()
