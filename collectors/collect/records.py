"""Round records (what one draft-and-verify round did) and their aggregation into table rows.

Contract: both collection modes reduce to the same `RoundRecord`s, so the trajectory and action
rows (and their latency, priced with a `LatencyProfile`) are computed by one piece of code.
Throughput is tokens emitted / priced time; mean accepted length A counts accepted drafted tokens
per round (the bonus token not included), so tokens per round is about A + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

from decoder.core.config import TreeConfig
from decoder.core.policies import RuntimeContext
from decoder.core.records import DRAFTLESS, TREE, RoundStats, StepRecord
from decoder.core.state import (
    CONTEXT_NAMES,
    LOOKAHEAD_NAME,
    RECORDED_NAMES,
    SIGNAL_NAMES,
    context_features,
    history_features,
    history_names,
)
from decoder.deploy.latency import LatencyProfile, RoundCounts, fed_before_calls, price_round
from decoder.deploy.runtime_costs import runtime_costs

LOOKAHEAD = RECORDED_NAMES.index(LOOKAHEAD_NAME)  # its place in a step's recorded signals


@dataclass(frozen=True)
class RoundRecord:
    accepted: int
    emitted: int
    verified_nodes: int  # including the root
    mid_tree_tokens: tuple[int, ...]  # tree nodes forwarded, one entry per mid call
    mid_catch_up: int  # committed tokens forwarded with the round's first mid call
    small_steps: int
    signals: tuple[tuple[float, ...], ...]  # before each step, RECORDED_NAMES order (decoder.core.state)
    measured_ms: float = math.nan  # wall time without collection overhead (execute mode only)
    tree_nodes: int = 0  # live tree nodes before the prune, root included (0: unknown, priced as verified)
    small_frontier: int | None = None  # frontier nodes the small steps expanded in all (None: unknown)
    mid_lag: int = 0  # committed tokens the mid drafter's cache lacked at the round's start
    decisions: int | None = None  # scheduler decisions taken (None: one per step)
    prompt_blocks: int = 0  # blocks of the prompt's top-m rows its n-gram steps computed first

    @property
    def mid_call_tokens(self) -> tuple[int, ...]:
        if not self.mid_tree_tokens:
            return ()
        return (self.mid_tree_tokens[0] + self.mid_catch_up, *self.mid_tree_tokens[1:])

    def counts(self) -> RoundCounts:
        return RoundCounts(
            verified_nodes=self.verified_nodes,
            mid_call_tokens=self.mid_call_tokens,
            small_steps=self.small_steps,
            decisions=len(self.signals) if self.decisions is None else self.decisions,
            mid_call_fed=fed_before_calls(self.mid_tree_tokens),
            tree_nodes=self.tree_nodes or None,
            small_frontier=self.small_frontier,
            prompt_blocks=self.prompt_blocks,
        )


def round_stats(record: RoundRecord, bits: tuple[bool, ...]) -> RoundStats:
    """The decoder's RoundStats of a replayed round, for a scheduler that watches rounds
    (``round_done``): its accepted and emitted tokens, sizes, mode and one StepRecord per step
    carrying what the round's pricing reads, so decoder.deploy.latency.counts_from_round gives
    ``record.counts()`` (tests/test_adaptive.py). Pool sizes and created nodes are not replayed (0)."""
    calls = iter(record.mid_tree_tokens)
    first_mid = bits.index(True) if any(bits) else -1
    small = [k for k, mid in enumerate(bits) if not mid]
    decided = len(bits) if record.decisions is None else record.decisions
    steps = tuple(
        StepRecord(
            used_mid=mid,
            pool_size=0,
            frontier_size=(record.small_frontier or 0) if small and k == small[0] else 0,
            historical_picks=0,
            created=0,
            mid_catch_up=record.mid_catch_up if k == first_mid else 0,
            mid_tree_tokens=next(calls) if mid else 0,
            decided=k < decided,
        )
        for k, mid in enumerate(bits)
    )
    return RoundStats(
        accepted=record.accepted,
        emitted=record.emitted,
        tree_size=max(record.tree_nodes - 1, record.verified_nodes - 1),
        verified_size=record.verified_nodes - 1,
        steps=steps,
        times={},
        mid_lag=record.mid_lag,
        prompt_blocks=record.prompt_blocks,
        mode=TREE if record.verified_nodes > 1 else DRAFTLESS,
    )


@dataclass(frozen=True)
class ReportKey:
    report_id: str
    pair_id: str
    dataset_id: str

    def as_row(self) -> dict[str, str]:
        return {"report_id": self.report_id, "pair_id": self.pair_id, "dataset_id": self.dataset_id}


def runtime_for(profile: LatencyProfile, prompt_tokens: float, tree: TreeConfig) -> RuntimeContext:
    """The runtime context a scheduler sees: typical verify and mid-call times from the profile
    (decoder.deploy.runtime_costs, which a deployment bundle's decoder also builds them with)."""
    return runtime_costs(profile, tree).context(prompt_tokens)


def bits_text(bits: tuple[bool, ...]) -> str:
    return "".join("1" if b else "0" for b in bits)


def trajectory_rows(
    key: ReportKey,
    schedule_id: int,
    bits: tuple[bool, ...],
    rounds: list[RoundRecord],
    prompt_tokens: list[int],
    prompt_rounds: list[int],
    profile: LatencyProfile,
    runtime: RuntimeContext,
    mode: str,
) -> tuple[dict, list[dict]]:
    """The trajectory row and its D action rows. ``rounds`` holds the prompts' rounds in order:
    ``prompt_rounds[i]`` of them, emitting ``prompt_tokens[i]`` tokens, for prompt i."""
    if sum(prompt_rounds) != len(rounds) or len(prompt_rounds) != len(prompt_tokens):
        raise ValueError(
            f"{len(rounds)} rounds, but per-prompt round counts {prompt_rounds} and tokens {prompt_tokens}"
        )
    depth = len(bits)
    n_tokens, n_prompts = sum(prompt_tokens), len(prompt_tokens)
    priced = [price_round(profile, r.counts()) for r in rounds]
    total_ms = sum(priced)
    ends = list(accumulate(prompt_rounds))
    prompt_ms = [sum(priced[e - n : e]) for n, e in zip(prompt_rounds, ends, strict=True)]
    measured = [r.measured_ms for r in rounds]
    measured_total = sum(measured)
    mean_a = sum(r.accepted for r in rounds) / len(rounds)
    outcome = {
        "mean_accepted_length": mean_a,
        "round_latency_ms": total_ms / len(rounds),
        "throughput_tok_per_s": 1e3 * n_tokens / total_ms,
    }
    calls = [t for r in rounds for t in r.mid_call_tokens]
    traj = {
        **key.as_row(),
        "schedule_id": schedule_id,
        "schedule": bits_text(bits),
        "mode": mode,
        "profile_id": f"{profile.pair}@{profile.device}",
        "n_prompts": n_prompts,
        "n_rounds": len(rounds),
        "n_tokens": n_tokens,
        **outcome,
        "tokens_per_round": n_tokens / len(rounds),
        "n_small_steps": sum(r.small_steps for r in rounds),
        "n_mid_calls": len(calls),
        "mid_tokens": sum(calls),
        "mid_catch_up_tokens": sum(r.mid_catch_up for r in rounds),
        "verified_nodes": sum(r.verified_nodes for r in rounds),
        "mid_call_tokens": calls,
        "verified_nodes_per_round": [r.verified_nodes for r in rounds],
        "prompt_n_tokens": list(prompt_tokens),
        "prompt_latency_ms": prompt_ms,
        "measured_round_latency_ms": measured_total / len(rounds),
        "measured_throughput_tok_per_s": 1e3 * n_tokens / measured_total if measured_total > 0 else math.nan,
    }
    context = dict(zip(CONTEXT_NAMES, context_features(runtime), strict=True))
    actions = []
    for k in range(1, depth + 1):
        # the lag differs from round to round: the action row holds the mean over rounds, as the signals
        per_round = [
            history_features(k, depth, bits[: k - 1], r.mid_lag, r.signals[k - 1][LOOKAHEAD]) for r in rounds
        ]
        history = {n: sum(h[i] for h in per_round) / len(rounds) for i, n in enumerate(history_names(depth))}
        signals = [sum(r.signals[k - 1][i] for r in rounds) / len(rounds) for i in range(len(SIGNAL_NAMES))]
        actions.append(
            {
                **key.as_row(),
                "schedule_id": schedule_id,
                "step": k,
                "is_invoke": bits[k - 1],
                "prefix": bits_text(bits[: k - 1]),
                "suffix": bits_text(bits[k:]),
                **context,
                **history,
                **dict(zip(SIGNAL_NAMES, signals, strict=True)),
                **outcome,
            }
        )
    return traj, actions
