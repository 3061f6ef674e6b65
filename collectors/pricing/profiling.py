"""Measuring a pair's LatencyProfile with the decoder's own code paths (the `profile` stage's work).

Contract: everything runs on one fixed reference context of `context_len` cached tokens (target,
mid drafter and n-gram drafter); caches are cropped back before each timed call, so sizes are the
only thing that varies. First, one real round per fixed schedule (all 2^D; all-small only without
a mid) is built by the decoder's RoundBuilder on that context. Timed, as the decoder runs them:
- verify(n): TargetVerifier.verify on the first n nodes of the largest real tree (a prefix of a
  tree is a tree: parents come before children), in a round's order: right after an untimed
  target forward (a verify of the root: it reads every target weight, as the previous round's
  verify does) and a real n-gram step (a round without a mid call);
- mid(n, f): RoundBuilder.mid_step (rescore + pool + top_children + graft) on the first f + n
  nodes of that tree, its first f nodes fed beforehand (untimed), so the call forwards n;
- n-gram step: RoundBuilder.small_step on every real state before a small step, grouped by the
  frontier it expands; a line (fixed + per frontier node) fitted through the groups' medians;
- decision: a LearnedScheduler of the student's shape (17 -> 64 -> 32 -> 1, random weights) on
  every real pre-step state: tree signals + history/context features + the NumPy MLP, averaged;
- mid end: MidDrafter.end_round after a call fed the largest fed count (KV kept for one path);
- tree(n): DraftTree.prune on the first n nodes plus the n-gram score-row update of a round;
- prompt block: one block of the prompt's top-m rows from its final hidden states (the output
  head over ROW_BLOCK positions: decoder/core/verify.py PromptRows.block), which an n-gram step pays
  the first time it reads a prompt position of that block;
- AR: AR_BURST greedy single-token target steps back to back, after AR_WARM untimed ones, per
  step. Timed one at a time after a random other component, a step found the caches cold and cost
  up to 1.5x what autoregressive decoding pays per token on the tiny zoo models (0.94-1.07 vs
  0.71-0.75 ms on zoo-m), which inflated every priced speedup of the cheap pairs.
- cold-cache round terms (decoder.deploy.latency), each a job timed right after that untimed target
  forward, less its warm figure (floored at 0): the verify of the pair's tree with a mid call of
  n tokens in between (n: `Grid.last_calls`; a larger call evicts more: zoo-s's 8-node verify cost
  0.84 / 0.89 / 1.02 ms after 1 / 16 / 100 tokens, 0.79 after a verify), less verify(pair's
  tree); a one-token mid call on no fed nodes,
  less mid(1, 0); one decision on a real first-step state (in turn), less the decision figure.
  Without them the profile priced zoo-chat-m's mid time at 0.72 and its decisions at 0.54 of what
  decoding paid (benchmarks/bench_pricing.py --components).
Where the grid needs more nodes than the largest real tree has, it is grown at random (no deeper).
Stability: every repeat runs `samples_per_repeat` passes over all components, each pass in a fresh
random order (round-robin: a noisy machine's drift hits all alike); a figure is the median over the
kept repeats of per-repeat medians. A job whose run takes `long_job_ms` or more (a deep target's
verify, an AR burst) runs in every pass of the first repeat and in one pass of each later one: on
zoo-l that halved a profile's time (37 s to 17 s a pass), its figures within the box's run-to-run
spread of the same profile taken twice. Clock (`profile_clock`): on a CPU with one torch thread,
the thread's CPU time (what the work costs, without the waits another process causes on a shared
machine); on CUDA, CUDA events (decoder.core.timing.device_clock); otherwise decoder.core.timing.make_clock's
wall clock.
"""

from __future__ import annotations

import itertools
import logging
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from collectors.pricing.profile_rounds import (
    PreStep,
    RealRounds,
    Reference,
    grown,
    prefix_tree,
    real_rounds,
    reference_context,
    student_like,
)
from decoder.core.config import TreeConfig
from decoder.core.policies import BuildState, RuntimeContext, StepContext
from decoder.core.tensors import causal_block, forward_block
from decoder.core.timing import device_clock, make_clock
from decoder.core.tree import DraftTree
from decoder.deploy.latency import DEFAULT_MID_FED, DEFAULT_MID_TOKENS, DEFAULT_SIZES, LatencyProfile
from decoder.models.pair import ModelPair

log = logging.getLogger(__name__)
AR_WARM, AR_BURST = 4, 8  # untimed, then timed consecutive AR steps per AR job
Key = tuple[Any, ...]  # (component, *sizes)


@dataclass(frozen=True)
class Job:
    setup: Callable[[], Any]  # untimed: restore the reference state; the result is run's argument
    run: Callable[[Any], object]  # the timed call
    units: int = 1  # decisions or steps one run times (the timing is divided by it)


@dataclass(frozen=True)
class Grid:
    """The sizes a profile is measured at."""

    verify: tuple[int, ...]  # tree nodes incl. the root (at most the budget + 1)
    tree: tuple[int, ...]  # live tree nodes incl. the root
    mid_tokens: tuple[int, ...]
    mid_fed: tuple[int, ...]

    @property
    def first_call(self) -> tuple[int, ...]:
        """(tokens, fed) of the mid_cold job: the grid's smallest call, (1, 0) by default; () w/o a mid."""
        return (self.mid_tokens[0], self.mid_fed[0]) if self.mid_tokens else ()

    @property
    def last_calls(self) -> tuple[int, ...]:
        """Token counts of the round's last mid call the verify's cold term is timed after: the grid's
        smallest, middle and largest (1, 16 and 128 by default); () without a mid."""
        t = self.mid_tokens
        return tuple(sorted({t[0], t[len(t) // 2], t[-1]})) if t else ()

    @property
    def max_nodes(self) -> int:
        mid = max(self.mid_fed) + max(self.mid_tokens) if self.mid_tokens else 1
        return max(max(self.verify), max(self.tree), mid)


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


def small_steps_by_frontier(ref: Reference, real: RealRounds) -> dict[int, list[PreStep]]:
    """The real states before small steps, grouped by the frontier size the step expands."""
    groups: dict[int, list[PreStep]] = {}
    for p in real.steps:
        if not p.invoke:
            f = ref.builder.small_step(p.state.copy(), ref.context, p.step).frontier_size
            groups.setdefault(f, []).append(p)
    return dict(sorted(groups.items()))


def fit_small_step(ms: dict[int, float], counts: dict[int, int]) -> tuple[float, float, float]:
    """(fixed ms, ms per frontier node, mean frontier): least squares through the per-frontier
    medians weighted by how many real steps had that frontier; both costs kept >= 0."""
    w = np.array([counts[f] for f in ms], dtype=float)
    x, y = np.array(list(ms), dtype=float), np.array(list(ms.values()))
    mean_x, mean_y = float(w @ x / w.sum()), float(w @ y / w.sum())
    var = float(w @ (x - mean_x) ** 2)
    slope = max(0.0, float(w @ ((x - mean_x) * (y - mean_y))) / var) if var > 0 else 0.0
    fixed = mean_y - slope * mean_x
    if fixed < 0:  # through the origin instead
        fixed, slope = 0.0, float(w @ (x * y) / (w @ (x * x)))
    return fixed, slope, mean_x


def mid_job(ref: Reference, big: DraftTree, n_new: int, n_fed: int) -> Job:
    """One mid forward of n_new nodes after n_fed already fed this round (the benchmarks reuse it)."""

    def setup() -> BuildState:
        ref.rewind_mid()
        if n_fed:
            ref.mid.rescore(prefix_tree(big, n_fed), ref.context)  # type: ignore[union-attr]
        return BuildState(
            prefix_tree(big, n_fed + n_new), set(range(n_fed)), list(range(n_fed, n_fed + n_new))
        )

    return Job(setup, lambda state: ref.builder.mid_step(state, ref.context, 2))


def _mid_end_job(ref: Reference, big: DraftTree, n_fed: int) -> Job:
    """MidDrafter.end_round after a round that fed n_fed nodes, keeping the deepest node's path."""
    tree = prefix_tree(big, max(1, n_fed))
    deepest = max(range(len(tree)), key=lambda v: (tree.depths[v], -v))

    def setup() -> list[int]:
        ref.rewind_mid()
        ref.mid.rescore(prefix_tree(big, len(tree)), ref.context)  # type: ignore[union-attr]
        return tree.path(deepest)

    return Job(setup, lambda path: ref.mid.end_round(path))  # type: ignore[union-attr]


def grid_jobs(
    ref: Reference, real: RealRounds, big: DraftTree, grid: Grid, cfg: TreeConfig
) -> dict[Key, Job]:
    """Every timed component of the profile, keyed (component, *sizes)."""
    rng = np.random.default_rng(0)  # only used by sampling, which the greedy verify never does
    verifier, ctx = ref.verifier, ref.context
    jobs: dict[Key, Job] = {}
    pair_tree, root = prefix_tree(big, grid.verify[-1]), prefix_tree(big, 1)
    small = next(p for p in real.steps if not p.invoke)  # the all-small schedule has only these

    def after_verify() -> None:  # untimed: a target forward (it reads all the target's weights as
        ref.rewind_target()  # the previous round's verify does, at a fraction of a large tree's cost)
        verifier.verify(root, 0.0, rng)
        ref.rewind_target()

    def after_small() -> None:  # untimed: ... then an n-gram step (a round without a mid call)
        after_verify()
        ref.builder.small_step(small.state.copy(), ctx, small.step)

    for n in grid.verify:
        tree = prefix_tree(big, n)
        jobs["verify", n] = Job(lambda t=tree: (after_small(), t)[1], lambda t: verifier.verify(t, 0.0, rng))

    def ar_setup() -> int:  # untimed warm-up steps: AR decoding runs its steps back to back
        ref.rewind_target()
        return ar_burst(ref, ref.context[-1], 0, AR_WARM)

    jobs["ar", 1] = Job(ar_setup, lambda token: ar_burst(ref, token, AR_WARM, AR_BURST), AR_BURST)
    for f, group in small_steps_by_frontier(ref, real).items():
        jobs["ngram", f] = Job(
            lambda g=group: [(p.step, p.state.copy()) for p in g],
            lambda states: [ref.builder.small_step(s, ctx, k) for k, s in states],
            len(group),
        )
    student = student_like(cfg.depth, cfg.width, np.random.default_rng(1))
    runtime = RuntimeContext(len(ctx), 1.0, 1.0)
    jobs["decision", 0] = Job(
        lambda: real.steps,
        lambda steps: [student(StepContext(p.step, cfg.depth, p.history, p.state, runtime)) for p in steps],
        len(real.steps),
    )
    firsts = itertools.cycle([p for p in real.steps if p.step == 1])

    def first_decision() -> PreStep:
        after_verify()
        return next(firsts)

    jobs["decision_cold", 0] = Job(
        first_decision, lambda p: student(StepContext(p.step, cfg.depth, p.history, p.state, runtime))
    )
    top = ref.top
    last = max(0, len(top.tokens) - 2)
    rows = (top.start + last, top.tokens[last:], top.logps[last:])
    for n in grid.tree:
        tree = prefix_tree(big, n)
        jobs["tree", n] = Job(
            lambda t=tree: t, lambda t: (t.prune(cfg.budget), ref.ngram.cache.set_rows(*rows))
        )
    jobs["prompt_block", 0] = Job(lambda: None, lambda _: ref.rows.block(0))
    if ref.mid is not None:
        one = mid_job(ref, big, *grid.first_call)

        def first_mid() -> BuildState:
            after_verify()
            return one.setup()

        jobs["mid_cold", *grid.first_call] = Job(first_mid, one.run)
        for n in grid.last_calls:
            last = mid_job(ref, big, n, grid.mid_fed[0])

            def after_mid(call: Job = last) -> DraftTree:  # untimed: a target forward, then a mid call
                after_verify()
                call.run(call.setup())
                return pair_tree

            jobs["verify_cold", n] = Job(after_mid, lambda t: verifier.verify(t, 0.0, rng))
        jobs["mid_end", 0] = _mid_end_job(ref, big, max(grid.mid_fed))
        for f in grid.mid_fed:
            for n in grid.mid_tokens:
                jobs["mid", n, f] = mid_job(ref, big, n, f)
    return jobs


def ar_burst(ref: Reference, token: int, done: int, n: int) -> int:
    """n greedy one-token target steps back to back after the reference context and ``done``
    earlier steps, fed ``token`` first, as autoregressive decoding runs them (last-position logits
    only); returns the next token."""
    for i in range(done, done + n):
        block = causal_block([token], ref.n_ctx + i, ref.n_ctx + i)
        logits = forward_block(ref.verifier.model, ref.verifier.cache, block, logits_to_keep=1)
        token = int(logits[-1].argmax())
    return token


def profile_clock(device: torch.device) -> tuple[Callable[[], float], str]:
    """This thread's CPU time on a CPU with one torch thread: all the work runs in this thread, so
    time the core spends on other processes is not counted (a shared machine's contention does not
    move the profile). On CUDA, CUDA events (decoder.core.timing.device_clock): the GPU's own timing of
    the work between two readings. Otherwise the decoder's wall clock."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time, "thread_cpu"
    if device.type == "cuda":
        return device_clock(device)
    return make_clock(device), "wall"


def make_grid(sizes: Sequence[int], mid_tokens: Sequence[int], mid_fed: Sequence[int], budget: int) -> Grid:
    """verify at the sizes up to budget + 1 (at least the smallest), tree at all; no mid_tokens: no mid."""
    clean = sorted({int(n) for n in sizes})
    tokens, fed = sorted({int(n) for n in mid_tokens}), sorted({int(n) for n in mid_fed})
    if not clean or clean[0] < 1 or (tokens and (tokens[0] < 1 or not fed or fed[0] < 0)):
        raise ValueError(
            f"bad profile sizes: sizes={list(sizes)}, mid_tokens={list(mid_tokens)}, mid_fed={list(mid_fed)}"
        )
    verify = tuple(n for n in clean if n <= budget + 1) or (clean[0],)
    return Grid(verify, tuple(clean), tuple(tokens), tuple(fed) if tokens else ())


def robust_medians(
    jobs: dict[Key, Job],
    clock: Callable[[], float],
    warmup: int,
    repeats: int,
    passes: int,
    seed: int = 0,
    desc: str = "profile",
    long_ms: float = 0.0,
) -> dict[Key, float]:
    """ms per job and unit: median over kept repeats of the median of a repeat's samples; every
    pass runs every job once, in a fresh random order. ``long_ms`` > 0: a job whose run took at
    least that long in the first repeat (median of its samples) runs in the first pass of each
    later repeat only; one sample of a long job varies less, relatively, than one of a short job,
    and the long ones (a deep target's forwards) are most of the profile's time."""
    keys = list(jobs)
    rng = np.random.default_rng(seed)
    kept: dict[Key, list[float]] = {key: [] for key in keys}
    runs = dict.fromkeys(keys, passes)  # passes a job runs in, per repeat
    for rep in tqdm(range(warmup + repeats), desc=desc, disable=not sys.stderr.isatty()):
        samples: dict[Key, list[float]] = {key: [] for key in keys}
        for p in range(passes):
            for i in rng.permutation(len(keys)):
                if p >= runs[keys[i]]:
                    continue
                job = jobs[keys[i]]
                arg = job.setup()
                t0 = clock()
                job.run(arg)
                samples[keys[i]].append((clock() - t0) / job.units)
        if rep == 0 and long_ms > 0:
            for key in keys:
                if 1e3 * statistics.median(samples[key]) * jobs[key].units >= long_ms:
                    runs[key] = 1
        if rep >= warmup:
            for key in keys:
                kept[key].append(statistics.median(samples[key]))
    return {key: 1e3 * statistics.median(v) for key, v in kept.items()}


def measure_profile(
    pair: ModelPair,
    name: str,
    context_len: int = 256,
    sizes: Sequence[int] = DEFAULT_SIZES,
    warmup: int = 2,
    repeats: int = 9,
    tree_config: TreeConfig = TreeConfig(),  # noqa: B008 (frozen: a shared default is safe)
    mid_tokens: Sequence[int] = DEFAULT_MID_TOKENS,
    mid_fed: Sequence[int] = DEFAULT_MID_FED,
    samples_per_repeat: int = 3,
    seed: int = 0,
    long_job_ms: float = 0.0,
) -> LatencyProfile:
    """Measure a pair's latency profile (what is timed and how: see the module docstring);
    ``long_job_ms``: as robust_medians' ``long_ms``."""
    cfg = tree_config
    grid = make_grid(sizes, mid_tokens if pair.mid is not None else (), mid_fed, cfg.budget)
    if context_len < 1 or warmup < 0 or repeats < 1 or samples_per_repeat < 1 or not long_job_ms >= 0:
        raise ValueError(
            f"bad profile settings: context_len={context_len}, warmup={warmup}, repeats={repeats}, "
            f"samples_per_repeat={samples_per_repeat}, long_job_ms={long_job_ms}"
        )
    max_depth = max(cfg.depth * max(cfg.ngram_chain_len, 1), AR_WARM + AR_BURST)  # nor the AR job
    if context_len + 1 + max_depth > pair.context_len:
        raise ValueError(
            f"context_len {context_len} + a round's tree depth exceed the pair's {pair.context_len}"
        )
    device = pair.target.device
    clock, clock_name = profile_clock(device)
    ref = Reference(pair, reference_context(pair, context_len + 1, seed), cfg)
    real = real_rounds(ref, cfg.depth)
    biggest = max(real.trees, key=len)
    big = grown(
        biggest, grid.max_nodes, pair.vocab_size, np.random.default_rng(seed), max(*biggest.depths, cfg.depth)
    )
    jobs = grid_jobs(ref, real, big, grid, cfg)
    desc = f"profile {name}"
    ms = robust_medians(jobs, clock, warmup, repeats, samples_per_repeat, seed, desc, long_job_ms)
    ngram = {key[1]: (ms[key], jobs[key].units) for key in jobs if key[0] == "ngram"}
    small = fit_small_step({f: v[0] for f, v in ngram.items()}, {f: v[1] for f, v in ngram.items()})

    warm_verify = ("verify", grid.verify[-1])

    def cold(key: Key, warm: Key) -> float:  # extra over the warm figure (0 where not timed: no mid)
        return max(0.0, ms[key] - ms[warm]) if key in ms else 0.0

    profile = LatencyProfile(
        pair=name,
        device=str(device),
        device_name=device_name(device),
        torch_threads=torch.get_num_threads(),
        clock=clock_name,
        torch_version=torch.__version__,
        dtype=str(pair.target.dtype).removeprefix("torch."),
        context_len=context_len,
        warmup=warmup,
        repeats=repeats,
        samples_per_repeat=samples_per_repeat,
        long_job_ms=long_job_ms,
        verify_points=tuple((n, ms["verify", n]) for n in grid.verify),
        mid_tokens=grid.mid_tokens,
        mid_fed=grid.mid_fed,
        mid_grid_ms=tuple(tuple(ms["mid", n, f] for n in grid.mid_tokens) for f in grid.mid_fed),
        mid_end_ms=ms.get(("mid_end", 0), 0.0),
        verify_cold_points=tuple((n, cold(("verify_cold", n), warm_verify)) for n in grid.last_calls),
        mid_cold_ms=cold(("mid_cold", *grid.first_call), ("mid", *grid.first_call)),
        decision_cold_ms=cold(("decision_cold", 0), ("decision", 0)),
        ngram_step_ms=small[0],
        ngram_node_ms=small[1],
        ngram_mean_frontier=small[2],
        decision_ms=ms["decision", 0],
        ar_token_ms=ms["ar", 1],
        tree_points=tuple((n, ms["tree", n]) for n in grid.tree),
        prompt_block_ms=ms["prompt_block", 0],
    )
    log.info(
        "profile %s on %s: verify(%d) %.3f ms, AR step %.3f ms, decision %.4f ms",
        name,
        device,
        grid.verify[-1],
        profile.verify_ms(grid.verify[-1]),
        profile.ar_token_ms,
        profile.decision_ms,
    )
    return profile
