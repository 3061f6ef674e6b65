"""A `decoder.deploy.switch_off.RoundPricer` over a measured LatencyProfile: what a decoded round cost.

Contract: a drafted round is priced as decoder.deploy.latency prices it (`price_round` of its
counts; a DRAFTLESS round's autoregressive step as the profile's AR step, its drafting, tree
work and scheduler decisions on top); an OFF round (speculation switched off) pays the AR step
alone. A fixed schedule takes no decisions (as collectors.evaluation.cell prices it);
`for_policy` sets that from the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from decoder.core.policies import FixedSchedule
from decoder.core.records import OFF, RoundStats
from decoder.deploy.latency import LatencyProfile, counts_from_round, round_parts


@dataclass(frozen=True)
class ProfilePricer:
    """Rounds priced with one pair's profile (module docstring)."""

    profile: LatencyProfile
    decisions: bool = True  # price the scheduler's decisions (False for a fixed schedule)

    @classmethod
    def for_policy(cls, profile: LatencyProfile, policy: object) -> ProfilePricer:
        """Decisions priced unless the policy (or the one a wrapper holds) is a fixed schedule."""
        inner = getattr(policy, "inner", policy)
        fixed = isinstance(inner, FixedSchedule) or (isinstance(inner, str) and inner != "ddtree")
        return cls(profile, decisions=not fixed)

    @property
    def ar_ms(self) -> float:
        return self.profile.ar_token_ms

    def round_ms(self, stats: RoundStats) -> float:
        if stats.mode == OFF:
            return self.profile.ar_token_ms
        counts = counts_from_round(stats)
        priced = counts if self.decisions else replace(counts, decisions=0)
        return sum(round_parts(self.profile, priced).values())
