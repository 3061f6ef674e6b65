"""Measuring a pair's LatencyProfile with the decoder's own code paths (the `profile` stage's work).

Contract: every forward runs on top of one fixed reference context of `context_len` cached tokens;
the cache is cropped back after each timed call, so sizes are the only thing that varies. Timed are
TargetVerifier.verify on random prefix-closed trees (nodes incl. the root), MidDrafter.rescore +
top_children over the same trees (tokens forwarded = tree nodes; catch-up tokens are priced alike),
one single-token target step, all-small RoundBuilder rounds (n-gram step = round / depth), the
student's MLP shape in NumPy, and times['tree'] of a short real generate(). Each figure is the
median of `repeats` timings taken with decoder.timing.make_clock (which syncs CUDA) after `warmup`
discarded ones; forwards of all sizes are interleaved so a noisy machine's drift hits all alike.
"""

from __future__ import annotations

import logging
import platform
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from collectors.latency import DEFAULT_SIZES, LatencyProfile
from decoder.config import DecodeConfig, TreeConfig
from decoder.construct import RoundBuilder
from decoder.generate import generate
from decoder.mid import MidDrafter
from decoder.models import ModelPair
from decoder.ngram import NgramDrafter
from decoder.policies import FixedSchedule
from decoder.tensors import causal_block, crop_cache, forward_block
from decoder.timing import make_clock, zero_times
from decoder.tree import DraftTree
from decoder.verify import TargetVerifier, TopLogps

log = logging.getLogger(__name__)
Key = tuple[str, int]  # (component, size)


@dataclass(frozen=True)
class _Job:
    run: Callable[[], object]  # the timed call
    reset: Callable[[], None]  # untimed: restore the reference context


def device_name(device: torch.device) -> str:
    """GPU name, or the CPU model from /proc/cpuinfo (platform fallback)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="ignore").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def reference_context(pair: ModelPair, n_tokens: int, seed: int = 0) -> list[int]:
    """n_tokens ids with the repetition of real text, so n-gram steps find matches: this Python's
    stdlib source through the pair's tokenizer, or (no tokenizer) phrases from a small random bank."""
    ids: list[int] = []
    if pair.tokenizer is not None:
        for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            text = src.read_text(errors="ignore")
            ids += [t for t in pair.tokenizer(text)["input_ids"] if t < pair.vocab_size]
            if len(ids) >= n_tokens:
                return ids[:n_tokens]
    rng = np.random.default_rng(seed)
    bank = rng.integers(1, pair.vocab_size, size=(32, 8))
    while len(ids) < n_tokens:
        ids += bank[rng.integers(len(bank))].tolist()
    return ids[:n_tokens]


def random_tree(n_nodes: int, root: int, vocab: int, rng: np.random.Generator) -> DraftTree:
    """A random prefix-closed tree of exactly n_nodes nodes, the root included."""
    tree = DraftTree(root)
    while len(tree) < n_nodes:
        tree.add_child(int(rng.integers(len(tree))), int(rng.integers(vocab)), -1.0)
    return tree


def _median_ms(samples: Sequence[float]) -> float:
    return 1e3 * statistics.median(samples)


def _rewind_mid(mid: MidDrafter, context_len: int) -> None:
    """Drop this round's tree KV so the mid cache holds exactly the reference context again."""
    mid.end_round([])
    crop_cache(mid.cache, context_len)
    mid.n_committed = context_len


def _forward_jobs(
    pair: ModelPair, context: list[int], trees: dict[int, DraftTree], cfg: TreeConfig
) -> tuple[dict[Key, _Job], TopLogps]:
    """Timed model calls on the reference context (all but its last token cached), and its top-m."""
    n_ctx, root = len(context) - 1, context[-1]
    verifier = TargetVerifier(pair.target, pair.vocab_size, cfg.topk)
    top = verifier.prefill(context)
    rng = np.random.default_rng(0)  # only used by sampling, which the greedy verify never does

    def rewind_target() -> None:
        crop_cache(verifier.cache, n_ctx)

    jobs = {
        ("verify", n): _Job(lambda t=t: verifier.verify(t, 0.0, rng), rewind_target)
        for n, t in trees.items()
        if n <= max(cfg.budget + 1, min(trees))  # a verified tree never exceeds the budget + root
    }
    ar = causal_block([root], n_ctx, n_ctx)
    jobs["ar", 1] = _Job(
        lambda: int(forward_block(pair.target, verifier.cache, ar)[-1].argmax()), rewind_target
    )
    if pair.mid is None:
        return jobs, top
    mid = MidDrafter(pair.mid, pair.vocab_size)
    mid.rescore(DraftTree(root), context)  # catch up on the context once, untimed
    _rewind_mid(mid, n_ctx)
    for n, t in trees.items():
        frontier = t.live_nodes()[: cfg.width]
        jobs["mid", n] = _Job(
            lambda t=t, f=frontier: (mid.rescore(t, context), mid.top_children(f, cfg.topk)),
            lambda: _rewind_mid(mid, n_ctx),
        )
    return jobs, top


def _interleaved_medians(
    jobs: dict[Key, _Job], clock: Callable[[], float], warmup: int, repeats: int, desc: str
) -> dict[Key, float]:
    """Median ms per job; each repeat runs every job once, in the same order."""
    samples: dict[Key, list[float]] = {key: [] for key in jobs}
    for rep in tqdm(range(warmup + repeats), desc=desc, disable=not sys.stderr.isatty()):
        for key, job in jobs.items():
            t0 = clock()
            job.run()
            dt = clock() - t0
            job.reset()
            if rep >= warmup:
                samples[key].append(dt)
    return {key: _median_ms(s) for key, s in samples.items()}


def _ngram_step_ms(
    context: list[int], top: TopLogps, cfg: TreeConfig, clock: Callable[[], float], warmup: int, repeats: int
) -> float:
    """Median of (n-gram time of one all-small round) / depth on the reference context."""
    ngram = NgramDrafter(cfg.ngram_max_n, cfg.ngram_max_matches, cfg.ngram_chain_len)
    ngram.commit(context)
    ngram.cache.set_rows(top.start, top.tokens, top.logps)
    builder = RoundBuilder(cfg, ngram, None, clock)
    schedule = FixedSchedule((False,) * cfg.depth)
    steps = []
    for rep in range(warmup + repeats):
        times = zero_times()
        builder.build(context, schedule, times)
        if rep >= warmup:
            steps.append(times["ngram"] / cfg.depth)
    return _median_ms(steps)


def _scheduler_ms(rng: np.random.Generator, warmup: int, repeats: int, batch: int = 100) -> float:
    """One decision of the student's shape (17->64->32->1 ReLU, float64), timed in batches."""
    w1, w2, w3 = rng.normal(size=(17, 64)), rng.normal(size=(64, 32)), rng.normal(size=32)
    b1, b2, x = rng.normal(size=64), rng.normal(size=32), rng.normal(size=17)
    samples = []
    for rep in range(warmup + repeats):
        t0 = time.perf_counter()  # pure CPU work: no device to sync
        for _ in range(batch):
            h = np.maximum(np.maximum(x @ w1 + b1, 0.0) @ w2 + b2, 0.0)
            bool(h @ w3 > 0.0)
        if rep >= warmup:
            samples.append((time.perf_counter() - t0) / batch)
    return _median_ms(samples)


def _tree_overhead_ms(pair: ModelPair, prompt: list[int], cfg: TreeConfig, n_tokens: int) -> float:
    """Median times['tree'] per round of a short real decode (mid at odd steps when there is a mid)."""
    policy = "".join("10"[k % 2] for k in range(cfg.depth)) if pair.mid is not None else "all-small"
    generate(pair, prompt, policy, DecodeConfig(max_new_tokens=min(8, n_tokens), tree=cfg))
    res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=n_tokens, tree=cfg))
    return _median_ms([r.times["tree"] for r in res.rounds])


def measure_profile(
    pair: ModelPair,
    name: str,
    context_len: int = 256,
    sizes: Sequence[int] = DEFAULT_SIZES,
    warmup: int = 3,
    repeats: int = 15,
    tree_config: TreeConfig = TreeConfig(),  # noqa: B008 (frozen: a shared default is safe)
    overhead_tokens: int = 32,
    seed: int = 0,
) -> LatencyProfile:
    """Measure a pair's latency profile (what is timed and how: see the module docstring)."""
    sizes = sorted({int(n) for n in sizes})
    if context_len < 1 or warmup < 0 or repeats < 1 or overhead_tokens < 1 or not sizes or sizes[0] < 1:
        raise ValueError(
            f"bad profile settings: context_len={context_len}, sizes={sizes}, warmup={warmup}, "
            f"repeats={repeats}, overhead_tokens={overhead_tokens}"
        )
    if context_len + 1 + max(sizes[-1], overhead_tokens) > pair.context_len:
        raise ValueError(
            f"context_len {context_len} + tree/overhead tokens exceed the pair's {pair.context_len}"
        )
    device, clock, rng = pair.target.device, make_clock(pair.target.device), np.random.default_rng(seed)
    context = reference_context(pair, context_len + 1, seed)  # its last token is every tree's root
    trees = {n: random_tree(n, context[-1], pair.vocab_size, rng) for n in sizes}
    jobs, top = _forward_jobs(pair, context, trees, tree_config)
    ms = _interleaved_medians(jobs, clock, warmup, repeats, f"profile {name}")
    profile = LatencyProfile(
        pair=name,
        device=str(device),
        device_name=device_name(device),
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        dtype=str(pair.target.dtype).removeprefix("torch."),
        context_len=context_len,
        warmup=warmup,
        repeats=repeats,
        verify_points=tuple((n, ms["verify", n]) for n in sizes if ("verify", n) in ms),
        mid_points=tuple((n, ms["mid", n]) for n in sizes) if pair.mid is not None else (),
        ngram_step_ms=_ngram_step_ms(context, top, tree_config, clock, warmup, repeats),
        scheduler_ms=_scheduler_ms(rng, warmup, repeats),
        ar_token_ms=ms["ar", 1],
        tree_overhead_ms=_tree_overhead_ms(pair, context, tree_config, overhead_tokens),
    )
    log.info(
        "profile %s on %s: verify(%d) %.3f ms, AR step %.3f ms",
        name,
        device,
        tree_config.budget + 1,
        profile.verify_ms(tree_config.budget + 1),
        profile.ar_token_ms,
    )
    return profile
