"""Measured per-round costs of GRAFT's DDTree rounds, and the deterministic price of a round.

A DDTree round (decoder/graft/decode.py) is one block-drafter forward, the tree build (DDTree's
heap; with TDES the round's edge-score grid first), optionally a budget decision (SABA), and one
target verification of the tree. :func:`measure_costs` times the first three here, on one
reference context (a prompt prefilled into the target, the drafter reading its features), as
collectors/pricing/profiling.py times a latency profile: every job runs once per pass in a fresh random
order, a figure is the median over kept repeats of the per-repeat medians, and on a CPU with one
torch thread the clock is this thread's CPU time. Verification and AR come from the pair's
latency profile (decoder/deploy/latency.py), so given these measurements a round's price depends on
its counts only.

Price of a round that verifies n drafted nodes: drafter_ms + build_ms(n) + verify_ms(n + 1)
(+ saba_ms). build_ms interpolates the measured builds piecewise-linearly in n. Under a per-round
budget rule of cap c (decoder/graft/budget.py) every round builds c nodes and decides:
drafter_ms + build_ms(c) + rule_ms + verify_ms(n + 1), rule_ms measured at the largest size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from collectors.pricing.profiling import Job, profile_clock, robust_medians
from decoder.core.budget import linear_cost, saba_budget
from decoder.core.config import BlockBudgetRule
from decoder.core.verify import TargetVerifier
from decoder.deploy.latency import LatencyProfile, Points, interpolate
from decoder.graft.block import BlockProposer
from decoder.graft.budget import NODE_FEATURES, rule_budget
from decoder.graft.ddtree import build_ddtree
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair


@dataclass(frozen=True)
class GraftCosts:
    """One pair's measured drafting-side costs (ms) and its profile's verification and AR costs."""

    pair_id: str
    clock: str  # "thread_cpu" or "wall"
    context_len: int  # tokens of the reference context
    drafter_ms: float  # one block-drafter forward
    build_points: Points  # (drafted nodes, ms): DDTree by marginals
    tdes_build_points: Points  # (drafted nodes, ms): TDES edge grid + DDTree by edge scores
    saba_ms: float  # one SABA decision (its budget from the cost line)
    rule_ms: float  # one per-round rule decision on a tree of max(sizes) nodes
    verify_points: Points  # from the profile: (tree nodes incl. the root, ms)
    ar_token_ms: float  # from the profile

    def build_ms(self, n_nodes: int, tdes: bool) -> float:
        return interpolate(self.tdes_build_points if tdes else self.build_points, n_nodes)

    def verify_ms(self, n_nodes: int) -> float:
        """Verification of n_nodes drafted nodes plus the root; none drafted (a budget of 0) runs as
        the autoregressive step (decoder/graft/decode.py)."""
        return self.ar_token_ms if n_nodes == 0 else interpolate(self.verify_points, n_nodes + 1)

    def round_ms(self, n_nodes: int, tdes: bool, saba: bool) -> float:
        """The priced ms of one round verifying n_nodes drafted nodes (module docstring)."""
        return (
            self.drafter_ms
            + self.build_ms(n_nodes, tdes)
            + self.verify_ms(n_nodes)
            + (self.saba_ms if saba else 0.0)
        )

    def rule_round_ms(self, n_nodes: int, cap: int, tdes: bool) -> float:
        """The priced ms of a round under a budget rule of ``cap`` that verifies n_nodes nodes."""
        return self.drafter_ms + self.build_ms(cap, tdes) + self.rule_ms + self.verify_ms(n_nodes)

    def rule_costs(self, cap: int, tdes: bool) -> tuple[float, ...]:
        """rule_round_ms at B = 0..cap: the cost curve a rule of that cap decides over."""
        return tuple(self.rule_round_ms(b, cap, tdes) for b in range(cap + 1))

    def tdes_ms(self, n_nodes: int) -> float:
        """TDES scoring and its heap over the plain heap, building n_nodes."""
        return self.build_ms(n_nodes, True) - self.build_ms(n_nodes, False)

    def rule_overhead_ms(self, cap: int) -> float:
        """Full GRAFT's added decision time per round under a rule of ``cap``: TDES at the cap plus
        the rule's decision."""
        return self.tdes_ms(cap) + self.rule_ms

    def overhead_ms(self, n_nodes: int) -> float:
        """GRAFT's added decision time per round at n_nodes: TDES plus the SABA decision."""
        return self.tdes_ms(n_nodes) + self.saba_ms

    def saba_line(self, b_max: int, tdes: bool) -> tuple[float, float]:
        """SABA's line (c_verify, c_fixed): least squares of round_ms over B = 1..b_max."""
        budgets = list(range(1, b_max + 1))
        return linear_cost(budgets, [self.round_ms(b, tdes, saba=False) for b in budgets])

    def saba(self, b_max: int, tdes: bool) -> int:
        """The paper's SABA budget on this cost line (the same for every state: a_t cancels)."""
        return saba_budget(*self.saba_line(b_max, tdes), b_max)

    def to_json(self) -> dict:
        return asdict(self)


def measure_costs(
    pair: ModelPair,
    pair_id: str,
    proposer: BlockProposer,
    scorer: EdgeScorer,
    profile: LatencyProfile,
    context: list[int],
    topk: int,
    sizes: Sequence[int],
    warmup: int,
    repeats: int,
    passes: int,
) -> GraftCosts:
    """Time the drafter, the builds at ``sizes`` (with and without TDES) and SABA on one context."""
    if len(context) < 2:
        raise ValueError(f"the reference context needs >= 2 tokens, got {len(context)}")
    if not sizes or min(sizes) < 1:
        raise ValueError(f"build sizes must be positive node counts, got {list(sizes)}")
    verifier = TargetVerifier(pair.target, pair.vocab_size, 1, tuple(proposer.target_layers))
    with torch.inference_mode():
        verifier.prefill_context(context)
    feats = verifier.features
    marg = proposer.propose(feats, context, topk)
    root, ids, logps = context[-1], marg.ids, marg.logps
    line = linear_cost([1, 2], [profile.verify_ms(2), profile.verify_ms(3)])
    b_max = max(sizes)

    big = build_ddtree(root, ids, logps, b_max, pair.vocab_size)
    rule = BlockBudgetRule(
        (1.0,) * len(NODE_FEATURES), 0.0, tuple(profile.round_verify_ms(b + 1) for b in range(b_max + 1)), 0.1
    )

    def tdes_build(n: int) -> object:
        return build_ddtree(root, ids, logps, n, pair.vocab_size, scorer.for_round(root, ids, logps))

    jobs: dict[tuple, Job] = {
        ("drafter",): Job(lambda: None, lambda _: proposer.propose(feats, context, topk)),
        ("saba",): Job(lambda: None, lambda _: saba_budget(line[0], line[1] + 1.0, b_max), units=1),
        ("rule",): Job(lambda: None, lambda _: rule_budget(big, marg.first_logp, 2, marg.k, rule), units=1),
    }
    for n in sorted(set(sizes)):
        jobs[("build", n)] = Job(
            lambda: None, lambda _, n=n: build_ddtree(root, ids, logps, n, pair.vocab_size)
        )
        jobs[("tdes", n)] = Job(lambda: None, lambda _, n=n: tdes_build(n))
    clock, clock_name = profile_clock(pair.target.device)
    with torch.inference_mode():
        ms = robust_medians(jobs, clock, warmup, repeats, passes, desc=f"graft costs {pair_id}")
    grid = sorted(set(sizes))
    return GraftCosts(
        pair_id=pair_id,
        clock=clock_name,
        context_len=len(context),
        drafter_ms=ms[("drafter",)],
        build_points=tuple((n, ms[("build", n)]) for n in grid),
        tdes_build_points=tuple((n, ms[("tdes", n)]) for n in grid),
        saba_ms=ms[("saba",)],
        rule_ms=ms[("rule",)],
        verify_points=tuple((int(n), float(v)) for n, v in profile.verify_points),
        ar_token_ms=profile.ar_token_ms,
    )


def priced_speedup(costs: GraftCosts, tokens: int, round_ms: Sequence[float]) -> float:
    """AR's priced ms for the same tokens over the rounds' priced ms."""
    total = float(np.sum(round_ms))
    return tokens * costs.ar_token_ms / total if total > 0 else float("nan")
