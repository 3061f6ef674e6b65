"""Does the price match the clock? Priced against measured round latency of real decoding, per policy.

Contract: every prompt is decoded for real (target verification every round) under every policy,
prompt-major after one short warm-up per policy, so a noisy machine's drift hits all policies
alike. A fixed schedule (a bit string such as "10101", or "all-small" / "all-mid") runs in execute
mode (collectors.collect.execute.execute_prompt): its measured round latency leaves out the signal
recording, and it is priced without decisions, as a fixed schedule decides nothing at run time. A
scheduler callable runs through `generate` with the runtime context: its measured round latency
includes its decisions, and it is priced with the decisions it took. Measured = the sum of the
round's component times (decoder.core.decode), priced = decoder.deploy.latency.price_round of its counts.
On a shared machine the wall clock also counts time the core spent on other processes, which a
profile taken by CPU time (collectors.pricing.profiling.profile_clock) leaves out; so each row also has
the decodes' CPU share (this thread's CPU time / wall time, 1 on an idle machine and one torch
thread) and the ratio with the measured time scaled by it.

check_components splits the same comparison by component (verify, mid calls, n-gram steps,
decisions, tree work, and the AR baseline's steps), to tell which part of the cost model is off.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from collectors.collect.execute import execute_prompt
from decoder.core.config import DecodeConfig
from decoder.core.decode import autoregressive
from decoder.core.policies import FixedSchedule, RuntimeContext, StepContext, parse_policy
from decoder.core.timing import COMPONENTS
from decoder.deploy.latency import LatencyProfile, counts_from_round, price_round, round_parts
from decoder.generate import generate
from decoder.models.pair import ModelPair

Policy = str | Callable[[StepContext], bool]


@dataclass(frozen=True)
class RoundPrice:
    priced_ms: float
    measured_ms: float


@dataclass(frozen=True)
class Decoded:
    rounds: list[RoundPrice]
    n_tokens: int
    cpu_s: float  # this thread's CPU time over the whole decode
    wall_s: float


@dataclass(frozen=True)
class PricingRow:
    """One policy over the prompts: totals and the spread of per-round ratios."""

    policy: str
    n_rounds: int
    n_tokens: int
    priced_ms: float
    measured_ms: float
    round_ratio_median: float  # median over rounds of priced / measured
    round_ratio_p10: float
    round_ratio_p90: float
    cpu_share: float  # thread CPU time / wall time of the decodes (1: nothing else ran)

    @property
    def ratio(self) -> float:
        """Priced / measured over all rounds (the figure that should lie within 0.90-1.10)."""
        return self.priced_ms / self.measured_ms if self.measured_ms > 0 else float("nan")

    @property
    def cpu_ratio(self) -> float:
        """Priced / (measured x CPU share): the ratio without other processes' share of the core."""
        return self.ratio / self.cpu_share if self.cpu_share > 0 else float("nan")


def _decode(
    pair: ModelPair,
    prompt: list[int],
    policy: Policy,
    config: DecodeConfig,
    profile: LatencyProfile,
    runtime: RuntimeContext | None,
) -> Decoded:
    """Decode one prompt; each round priced and measured as the module docstring says."""
    parsed = parse_policy(policy, config.tree.depth)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    if isinstance(parsed, FixedSchedule):
        records, n_tokens = execute_prompt(pair, prompt, parsed.bits, config)
        rounds = [
            RoundPrice(price_round(profile, replace(r.counts(), decisions=0)), r.measured_ms) for r in records
        ]
    else:
        res = generate(pair, prompt, parsed, config, runtime)
        rounds = [
            RoundPrice(price_round(profile, counts_from_round(r)), 1e3 * sum(r.times.values()))
            for r in res.rounds
        ]
        n_tokens = res.decoded_tokens
    return Decoded(rounds, n_tokens, time.thread_time() - cpu0, time.perf_counter() - wall0)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _warmup_config(
    prompts: Sequence[list[int]], policies: Mapping[str, Policy], config: DecodeConfig, warmup_tokens: int
) -> DecodeConfig:
    """The short warm-up decode's config; refuses an empty prompt or policy set."""
    if not prompts or not policies:
        raise ValueError("need at least one prompt and one policy")
    return replace(config, max_new_tokens=min(warmup_tokens, config.max_new_tokens))


def check_pricing(
    pair: ModelPair,
    profile: LatencyProfile,
    prompts: Sequence[list[int]],
    policies: Mapping[str, Policy],
    config: DecodeConfig,
    runtime: RuntimeContext | None = None,
    warmup_tokens: int = 16,
) -> list[PricingRow]:
    """Priced / measured per policy (names are the mapping's keys), one row each, in its order."""
    warm = _warmup_config(prompts, policies, config, warmup_tokens)
    for policy in policies.values():
        _decode(pair, prompts[0], policy, warm, profile, runtime)
    runs: dict[str, list[Decoded]] = {name: [] for name in policies}
    for prompt in prompts:
        for name, policy in policies.items():
            runs[name].append(_decode(pair, prompt, policy, config, profile, runtime))
    rows = []
    for name, decoded in runs.items():
        rs = [r for d in decoded for r in d.rounds]
        ratios = [r.priced_ms / r.measured_ms for r in rs if r.measured_ms > 0]
        rows.append(
            PricingRow(
                policy=name,
                n_rounds=len(rs),
                n_tokens=sum(d.n_tokens for d in decoded),
                priced_ms=sum(r.priced_ms for r in rs),
                measured_ms=sum(r.measured_ms for r in rs),
                round_ratio_median=statistics.median(ratios) if ratios else float("nan"),
                round_ratio_p10=_quantile(ratios, 0.1) if ratios else float("nan"),
                round_ratio_p90=_quantile(ratios, 0.9) if ratios else float("nan"),
                cpu_share=sum(d.cpu_s for d in decoded) / sum(d.wall_s for d in decoded),
            )
        )
    return rows


def format_pricing(pair_name: str, rows: Sequence[PricingRow]) -> str:
    """A plain-text table: one line per policy."""
    head = (
        f"{'pair':<12} {'policy':<12} {'rounds':>6} {'priced ms':>10} {'measured ms':>11} "
        f"{'priced/meas':>11} {'round p10/50/90':>17} {'cpu share':>9} {'/cpu':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{pair_name:<12} {r.policy:<12} {r.n_rounds:>6d} {r.priced_ms:>10.1f} {r.measured_ms:>11.1f} "
            f"{r.ratio:>11.3f} {r.round_ratio_p10:>7.2f}/{r.round_ratio_median:.2f}/{r.round_ratio_p90:.2f} "
            f"{r.cpu_share:>9.2f} {r.cpu_ratio:>6.3f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class ComponentRow:
    """One policy's rounds over the prompts, per component: priced and measured ms, summed."""

    policy: str
    n_rounds: int
    priced_ms: dict[str, float]  # decoder.core.timing.COMPONENTS, or {"ar"}: the baseline's steps
    measured_ms: dict[str, float]


def check_components(
    pair: ModelPair,
    profile: LatencyProfile,
    prompts: Sequence[list[int]],
    policies: Mapping[str, Policy],
    config: DecodeConfig,
    runtime: RuntimeContext | None = None,
    warmup_tokens: int = 16,
) -> list[ComponentRow]:
    """Priced against measured per round component (which part of the cost model is off), one row
    per policy and a first row "ar": the baseline's one-token steps against ar_token_ms. Every policy,
    fixed ones too, decodes through `generate`, whose clock times each component; a fixed schedule
    is priced without decisions (it decides nothing at run time), so its "scheduler" row shows what
    asking it costs. Prompt-major after one short warm-up per policy, like check_pricing."""
    warm = _warmup_config(prompts, policies, config, warmup_tokens)
    parsed = {name: parse_policy(policy, config.tree.depth) for name, policy in policies.items()}
    autoregressive(pair, prompts[0], warm)
    for policy in parsed.values():
        generate(pair, prompts[0], policy, warm, runtime)
    names = ["ar", *parsed]
    priced = {name: dict.fromkeys(("ar",) if name == "ar" else COMPONENTS, 0.0) for name in names}
    measured = {name: dict(zero) for name, zero in priced.items()}
    n_rounds = dict.fromkeys(names, 0)
    for prompt in prompts:
        res = autoregressive(pair, prompt, config)
        priced["ar"]["ar"] += res.decoded_tokens * profile.ar_token_ms
        measured["ar"]["ar"] += 1e3 * (res.wall_s - res.prefill_s)
        n_rounds["ar"] += res.decoded_tokens
        for name, policy in parsed.items():
            fixed = isinstance(policy, FixedSchedule)
            for r in generate(pair, prompt, policy, config, runtime).rounds:
                counts = counts_from_round(r)
                parts = round_parts(profile, replace(counts, decisions=0) if fixed else counts)
                for component in COMPONENTS:
                    priced[name][component] += parts[component]
                    measured[name][component] += 1e3 * r.times[component]
                n_rounds[name] += 1
    return [ComponentRow(name, n_rounds[name], priced[name], measured[name]) for name in names]


def format_components(pair_name: str, rows: Sequence[ComponentRow]) -> str:
    """A plain-text table: one line per policy and component, the total of a policy's rounds last."""
    head = (
        f"{'pair':<12} {'policy':<10} {'component':<10} {'priced ms':>10} {'measured ms':>11} "
        f"{'priced/meas':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        parts = list(r.priced_ms)
        if len(parts) > 1:
            parts.append("total")
        for c in parts:
            p = sum(r.priced_ms.values()) if c == "total" else r.priced_ms[c]
            m = sum(r.measured_ms.values()) if c == "total" else r.measured_ms[c]
            ratio = f"{p / m:>11.3f}" if m > 0 else f"{'-':>11}"
            lines.append(f"{pair_name:<12} {r.policy:<10} {c:<10} {p:>10.1f} {m:>11.1f} {ratio}")
    return "\n".join(lines)
