"""An online adaptive schedule that needs no training: tiers of mid steps chosen by acceptance EMAs.

The baseline a learned scheduler has to beat, in the spirit of the adaptive speculation serving
engines ship (SGLang's EMA-driven tiers, vLLM's cost-model adaptive K): per request, it keeps an
exponential moving average of the drafted tokens accepted per round under each *tier* (tier t
calls the mid drafter at the first t of the D steps: 0 is All-Small, D is All-Mid) and prices each
tier with the runtime's cost model (``RuntimeContext``: a verify costs ``target_ms``, each mid call
``mid_ms``; decoder/deploy/runtime_costs.py). Its expected rate is (1 + EMA) / (target_ms + t x
mid_ms) tokens per ms.

Contract, per request (``reset`` at every generation):
- The tier is chosen once per round, before step 1, and holds for the round's D steps.
- The request starts at tier 0 (no mid call: the cheap side). A neighbouring tier (t - 1, t + 1)
  that has not run for ``probe`` rounds runs one round (a probe), so the estimates stay current.
- After each round (``round_done``) the tier's EMA takes the round's accepted tokens (weight
  ``ALPHA``); the current tier then moves to a neighbour whose estimated rate beats its own by more
  than the ``margin`` (relative): hill climbing with hysteresis over the tiers.

Two thresholds, ``margin`` and ``probe``, are chosen on a pair's calibration prompts like the pair
check's (the deploy stage); `AdaptiveTiers()` has the defaults a user gets from ``--policy
adaptive``. Decisions depend on the accepted counts and the runtime context only, never on a clock,
so the offline policy replay reproduces them exactly (collectors/collect/policy_replay.py hands it
each replayed round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from decoder.core.policies import ADAPTIVE, StepContext
from decoder.core.records import RoundStats

if TYPE_CHECKING:  # the rule itself needs no torch: a deployment bundle loads it without
    import torch

ALPHA = 0.3  # EMA weight of the newest round: about the last 3 rounds of a tier count most
DEFAULT_MARGIN = 0.05
DEFAULT_PROBE = 8


@dataclass(frozen=True)
class AdaptiveThresholds:
    """The rule's two thresholds (module docstring)."""

    margin: float = DEFAULT_MARGIN  # a neighbour must price this much faster (relative) to move
    probe: int = DEFAULT_PROBE  # rounds after which an unplayed neighbouring tier runs once

    def __post_init__(self) -> None:
        if not (isinstance(self.margin, int | float) and 0.0 <= self.margin < float("inf")):
            raise ValueError(f"adaptive margin must be a finite number >= 0, got {self.margin!r}")
        if isinstance(self.probe, bool) or not isinstance(self.probe, int) or self.probe < 1:
            raise ValueError(f"adaptive probe must be an integer >= 1, got {self.probe!r}")

    @property
    def name(self) -> str:
        """The policy string that names these thresholds ('adaptive:MARGIN:PROBE')."""
        return f"{ADAPTIVE}:{self.margin:g}:{self.probe}"


# The variants a pair check tries, the defaults first (the one it keeps unless another wins)
GRID = (
    AdaptiveThresholds(),
    *(
        AdaptiveThresholds(m, p)
        for m in (0.0, 0.05, 0.15)
        for p in (4, 8, 16)
        if (m, p) != (DEFAULT_MARGIN, DEFAULT_PROBE)
    ),
)


class AdaptiveTiers:
    """The adaptive rule as a scheduler (a callable on StepContext; module docstring). Its answers
    cost a few arithmetic operations a round, no tree signals or model: it takes no priced decisions
    (``decided`` is False, decoder.core.policies.decision_taken)."""

    decided = False

    def __init__(self, thresholds: AdaptiveThresholds | None = None, mid_over_target: float = 0.3) -> None:
        """mid_over_target: the cost of a mid call relative to a verify, used where the decode has
        no runtime context (a plain `--policy adaptive` run: the models' parameter ratio)."""
        self.thresholds = thresholds or AdaptiveThresholds()
        if not 0.0 <= mid_over_target < float("inf"):
            raise ValueError(f"mid_over_target must be a finite number >= 0, got {mid_over_target!r}")
        self.mid_over_target = mid_over_target
        self.reset()

    def reset(self) -> None:
        self.tier = 0
        self._ema: dict[int, float] = {}
        self._last: dict[int, int] = {0: 0}  # tier -> the round it last ran
        self._round = 0
        self._playing = 0
        self._costs = (1.0, self.mid_over_target)

    def __call__(self, ctx: StepContext) -> bool:
        if ctx.step == 1:
            if ctx.runtime is not None:
                self._costs = (ctx.runtime.target_ms, ctx.runtime.mid_ms)
            self._playing = self._next_tier(ctx.depth)
        return ctx.step <= self._playing

    def round_done(self, stats: RoundStats) -> None:
        """Take one finished round's accepted drafted tokens into its tier's EMA, then move."""
        played = self._playing
        old = self._ema.get(played)
        self._ema[played] = stats.accepted if old is None else ALPHA * stats.accepted + (1 - ALPHA) * old
        self._last[played] = self._round
        self._round += 1
        here = self.rate(self.tier)
        best = max((t for t in (self.tier - 1, self.tier + 1) if t in self._ema), key=self.rate, default=None)
        if best is not None and (here is None or self.rate(best) > here * (1.0 + self.thresholds.margin)):
            self.tier = best

    def rate(self, tier: int) -> float | None:
        """Expected tokens per ms of a tier from its EMA and the cost model (None: never ran)."""
        ema = self._ema.get(tier)
        if ema is None:
            return None
        target_ms, mid_ms = self._costs
        return (1.0 + ema) / max(target_ms + tier * mid_ms, 1e-9)

    def _next_tier(self, depth: int) -> int:
        """The tier of the round about to start: a stale neighbour's probe (one that never ran
        counts as last run ``probe`` rounds before the request, so it is probed in round 1), else
        the current tier."""
        probe = self.thresholds.probe
        for t in (self.tier + 1, self.tier - 1):
            if 0 <= t <= depth and self._round - self._last.get(t, -probe) > probe:
                return t
        return self.tier


def parameter_ratio(mid: torch.nn.Module, target: torch.nn.Module) -> float:
    """The mid drafter's parameters over the target's: the cost of a mid call relative to a verify
    where nothing was measured (a forward's cost grows with the weights it reads)."""
    return sum(p.numel() for p in mid.parameters()) / max(1, sum(p.numel() for p in target.parameters()))


def adaptive_for(text: str, mid_over_target: float | None = None) -> AdaptiveTiers:
    """The scheduler a policy string 'adaptive[:MARGIN:PROBE]' names (:func:`parse_adaptive`);
    ``mid_over_target`` None: its default, for a decode whose runtime context gives the costs."""
    thresholds = parse_adaptive(text)
    if mid_over_target is None:
        return AdaptiveTiers(thresholds)
    return AdaptiveTiers(thresholds, mid_over_target)


def parse_adaptive(text: str) -> AdaptiveThresholds:
    """'adaptive' (the defaults) or 'adaptive:MARGIN:PROBE'; a ValueError names what is wrong."""
    if text == ADAPTIVE:
        return AdaptiveThresholds()
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != ADAPTIVE:
        raise ValueError(
            f"policy {text!r}: expected 'adaptive' or 'adaptive:MARGIN:PROBE' (e.g. adaptive:0.05:8)"
        )
    try:
        margin, probe = float(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"policy {text!r}: MARGIN must be a number and PROBE an integer") from None
    return AdaptiveThresholds(margin, probe)
