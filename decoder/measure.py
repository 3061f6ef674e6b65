"""Side-by-side measurement of decoding policies with identical warm-up and instrumentation.

Every policy decodes the same prompts in an interleaved order (prompt-major, so slow drift of a
noisy machine hits all methods alike) after the same warm-up; speedups are ratios of tokens/s
measured in this one run. Greedy outputs are checked token-identical to autoregressive decoding.

Repeats (:class:`Repeats`): each prompt is decoded by every method once; then, as often as its
first autoregressive run's wall time asks (until AR's runs of the prompt add up to ``min_ar_s``,
at most ``most`` runs), every method runs it again in the same order. Each method keeps its run of
median wall time, so one slow moment of a shared machine moves no row. The default, :data:`ONCE`,
times every prompt once.

Lockstep (``run_side_by_side(lockstep=True)``, :func:`run_lockstep`): a prompt's methods decode
together, one round of each in turn, each round timed on its own; a paired comparison of two
methods then sees the machine within a fraction of a second of each other, not a whole decode apart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.decode import Steps
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR, RuntimeContext, StepContext
from decoder.core.timing import make_clock
from decoder.generate import generate, generate_steps
from decoder.graft.block import BlockProposer
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair

Policy = str | Callable[[StepContext], bool]


@dataclass(frozen=True)
class PolicyMeasurement:
    """One policy over a prompt set."""

    name: str
    n_tokens: int
    wall_s: float
    tokens_per_s: float
    speedup_vs_ar: float
    mean_accepted_length: float
    mid_call_rate: float  # share of drafting steps that called the mid drafter
    component_s: dict[str, float] = field(default_factory=dict)
    lossless: bool = True


def policy_name(policy: Policy) -> str:
    return policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)


def summarise(name: str, results: list[GenerationResult], ar_tps: float, lossless: bool) -> PolicyMeasurement:
    """Totals of one policy's generations; speedup against the given AR tokens/s."""
    n_tokens = sum(len(r.new_tokens) for r in results)
    wall = sum(r.wall_s for r in results)
    rounds = [rd for r in results for rd in r.rounds]
    steps = [s for rd in rounds for s in rd.steps]
    comp: dict[str, float] = {}
    for r in results:
        for k, v in r.component_times().items():
            comp[k] = comp.get(k, 0.0) + v
    tps = n_tokens / wall if wall > 0 else 0.0
    return PolicyMeasurement(
        name=name,
        n_tokens=n_tokens,
        wall_s=wall,
        tokens_per_s=tps,
        speedup_vs_ar=tps / ar_tps if ar_tps > 0 else float("nan"),
        mean_accepted_length=(sum(rd.accepted for rd in rounds) / len(rounds)) if rounds else 0.0,
        mid_call_rate=(sum(s.used_mid for s in steps) / len(steps)) if steps else 0.0,
        component_s=comp,
        lossless=lossless,
    )


@dataclass(frozen=True)
class Method:
    """A named policy, optionally with its own tree settings (ablations); for 'ddtree', the block
    proposer and edge scorer it drafts with (decoder.generate.generate's)."""

    name: str
    policy: Policy
    tree: TreeConfig | None = None
    proposer: BlockProposer | None = None
    edge_scorer: EdgeScorer | None = None


@dataclass(frozen=True)
class Repeats:
    """How often each prompt is timed: until autoregressive decoding's runs of it add up to
    ``min_ar_s`` seconds (from its first run's time), at most ``most`` times. Every method runs as
    often as AR on that prompt, interleaved, and keeps its run of median wall time (the lower median
    of an even count), so one moment of a noisy machine's contention moves no row; a prompt that
    takes ``min_ar_s`` or longer is timed once."""

    min_ar_s: float = 0.0
    most: int = 1

    def __post_init__(self) -> None:
        if self.min_ar_s < 0 or self.most < 1:
            raise ValueError(f"repeats need min_ar_s >= 0 and most >= 1, got {self}")

    def count(self, ar_wall_s: float) -> int:
        """Runs of a prompt whose first autoregressive run took ``ar_wall_s`` seconds."""
        if ar_wall_s <= 0:
            return self.most
        return max(1, min(self.most, math.ceil(self.min_ar_s / ar_wall_s)))


ONCE = Repeats()  # every prompt timed once


def median_run(runs: Sequence[GenerationResult]) -> GenerationResult:
    """The run of median wall time (the lower median of an even count)."""
    return sorted(runs, key=lambda r: r.wall_s)[(len(runs) - 1) // 2]


def run_lockstep(
    decodes: Sequence[Steps], clock: Callable[[], float] = time.perf_counter
) -> list[GenerationResult]:
    """Run decodes (decoder.generate.generate_steps) in turn, one step of each at a time, and time
    every step on its own: each result's wall_s and cpu_s are the sums over its own steps (``clock``,
    time.process_time). Steps of different decodes run a fraction of a second apart, so a slow
    spell of a shared machine falls on all of them alike instead of on whichever decode ran then.
    Results come back in the order of ``decodes``."""
    wall = [0.0] * len(decodes)
    cpu = [0.0] * len(decodes)
    results: list[GenerationResult | None] = [None] * len(decodes)
    while any(r is None for r in results):
        for i, steps in enumerate(decodes):
            if results[i] is not None:
                continue
            w0, c0 = clock(), time.process_time()
            try:
                next(steps)
                done = None
            except StopIteration as stop:
                done = stop.value
            wall[i] += clock() - w0
            cpu[i] += time.process_time() - c0
            if done is not None:
                results[i] = replace(done, wall_s=wall[i], cpu_s=cpu[i])
    return [r for r in results if r is not None]


def run_side_by_side(
    pair: ModelPair,
    prompts: Sequence[list[int]],
    methods: Sequence[Method],
    config: DecodeConfig,
    runtime: RuntimeContext | Sequence[RuntimeContext] | None = None,
    warmup_tokens: int = 16,
    timing: bool = True,
    repeats: Repeats = ONCE,
    every_run: dict[str, list[list[GenerationResult]]] | None = None,
    lockstep: bool = False,
) -> dict[str, list[GenerationResult]]:
    """Same warm-up for every method, then every prompt with every method (AR first, always).

    runtime: one context for every prompt, or one per prompt (each with its prompt's own length).
    timing=False: no per-component times (no per-step accelerator syncs), wall times only.
    repeats: each prompt's methods run again, in the same order, as often as :class:`Repeats`
    counts from AR's first run of it; each keeps its run of median wall time.
    every_run: when given, filled per method with every run of every prompt, in run order (the
    i-th runs of AR and of a method ran back to back), for paired per-run statistics.
    lockstep: a prompt's methods decode together, one round of each in turn (:func:`run_lockstep`),
    instead of one whole decode after another.
    """
    runtimes = list(runtime) if isinstance(runtime, Sequence) else [runtime] * len(prompts)
    if len(runtimes) != len(prompts):
        raise ValueError(f"{len(runtimes)} runtime contexts for {len(prompts)} prompts")
    methods = [Method(AR, AR), *[m for m in methods if m.name != AR]]
    if lockstep:
        shared = [m.name for m in methods if any(m.policy is o.policy for o in methods if o is not m)]
        if any(not isinstance(m.policy, str) for m in methods if m.name in shared):
            raise ValueError(f"lockstep: methods {shared} share one policy object, whose per-generation "
                             "state their interleaved decodes would mix; give each its own")  # fmt: skip
    configs = {m.name: replace(config, tree=m.tree) if m.tree is not None else config for m in methods}
    for m in methods:
        warm = replace(configs[m.name], max_new_tokens=min(warmup_tokens, config.max_new_tokens))
        generate(pair, prompts[0], m.policy, warm, runtimes[0], timing, m.proposer, m.edge_scorer)
    results: dict[str, list[GenerationResult]] = {m.name: [] for m in methods}

    def one_pass(
        prompt: list[int], rt: RuntimeContext | None, runs: dict[str, list[GenerationResult]]
    ) -> None:
        """Every method on the prompt once, AR first, each run added to its method's runs."""
        if lockstep:
            decodes = [
                generate_steps(pair, prompt, m.policy, configs[m.name], rt, timing, m.proposer, m.edge_scorer)
                for m in methods
            ]
            clock = make_clock(pair.target.device)
            for m, res in zip(methods, run_lockstep(decodes, clock), strict=True):
                runs[m.name].append(res)
            return
        for m in methods:
            res = generate(pair, prompt, m.policy, configs[m.name], rt, timing, m.proposer, m.edge_scorer)
            runs[m.name].append(res)

    for prompt, rt in zip(prompts, runtimes, strict=True):
        runs: dict[str, list[GenerationResult]] = {m.name: [] for m in methods}
        one_pass(prompt, rt, runs)
        for _ in range(repeats.count(runs[AR][0].wall_s) - 1):
            one_pass(prompt, rt, runs)
        for name, mine in runs.items():
            results[name].append(median_run(mine))
            if every_run is not None:
                every_run.setdefault(name, []).append(mine)
    return results


def lossless_flags(results: dict[str, list[GenerationResult]]) -> dict[str, bool]:
    """Whether each method's outputs equal autoregressive decoding's, prompt by prompt."""
    ref = [r.new_tokens for r in results[AR]]
    return {name: [r.new_tokens for r in res] == ref for name, res in results.items()}


def measure_policies(
    pair: ModelPair,
    prompts: Sequence[list[int]],
    policies: Sequence[Policy] = (AR, "all-small", "all-mid"),
    config: DecodeConfig | None = None,
    warmup_tokens: int = 16,
    runtime: RuntimeContext | None = None,
    timing: bool = True,
) -> dict[str, PolicyMeasurement]:
    """Decode every prompt with every policy (AR always included); return per-policy measurements."""
    config = config or DecodeConfig()
    methods = [Method(policy_name(p), p) for p in policies]
    results = run_side_by_side(pair, prompts, methods, config, runtime, warmup_tokens, timing)
    return summarise_results(results, config.temperature)


def summarise_results(
    results: dict[str, list[GenerationResult]], temperature: float
) -> dict[str, PolicyMeasurement]:
    """Per-method measurements of `run_side_by_side`'s results (greedy: checked against AR's)."""
    lossless = lossless_flags(results) if temperature == 0 else dict.fromkeys(results, True)
    ar = results[AR]
    ar_tps = sum(len(r.new_tokens) for r in ar) / sum(r.wall_s for r in ar)
    return {n: summarise(n, res, ar_tps, lossless[n]) for n, res in results.items()}


def format_table(rows: dict[str, PolicyMeasurement], gain: bool = False) -> str:
    """A plain-text table, one line per policy: tokens, tok/s, speedup over AR, A, the share of
    drafting steps that called the mid drafter, with ``gain`` the net wall-clock gain over AR in
    percent (speedup - 1: the prefill is in both walls), and whether the output was lossless."""
    head = [f"{'policy':<12} {'tokens':>7} {'tok/s':>8} {'speedup':>8} {'A':>6} {'mid/step':>8}"]
    if gain:
        head.append(f"{'gain':>8}")
    head.append(f"{'lossless':>8}")
    lines = [" ".join(head)]
    lines.append("-" * len(lines[0]))
    for m in rows.values():
        cells = [
            f"{m.name:<12}",
            f"{m.n_tokens:>7d}",
            f"{m.tokens_per_s:>8.1f}",
            f"{m.speedup_vs_ar:>7.2f}x",
            f"{m.mean_accepted_length:>6.2f}",
            f"{m.mid_call_rate:>8.2f}",
        ]
        if gain:
            cells.append(f"{100 * (m.speedup_vs_ar - 1):>+7.1f}%")
        cells.append(f"{'yes' if m.lossless else 'NO':>8}")
        lines.append(" ".join(cells))
    return "\n".join(lines)
