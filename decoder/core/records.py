"""Plain records of one round: what a drafting step did (`StepRecord`), what a round did
(`RoundStats`) and how a request's rounds ran (`RoundModes`).

A leaf module: it imports nothing of its own package, so the modules that build rounds
(decoder/core/construct.py), decide them (decoder/core/policies.py) and report them
(decoder/core/outcome.py) all share these records without importing each other.

A round is one of three kinds (`RoundStats.mode`): a tree verified by the target (TREE); a round
whose tree held no drafted node after the prune, run as one autoregressive step (DRAFTLESS: drafting
ran, verification did not); or a round in which a switch-off wrapper (decoder/deploy/switch_off.py)
kept speculation off, one autoregressive step with no drafting at all (OFF).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TREE = "tree"
DRAFTLESS = "draftless"
OFF = "off"


@dataclass(frozen=True)
class StepRecord:
    """What one drafting step did."""

    used_mid: bool
    pool_size: int
    frontier_size: int
    historical_picks: int  # frontier nodes not created by the previous step
    created: int
    mid_catch_up: int  # committed tokens the mid forwarded to catch up
    mid_tree_tokens: int  # tree nodes the mid forwarded
    decided: bool = True  # the scheduler paid for a decision before this step (policies.decision_taken)


@dataclass(frozen=True)
class RoundStats:
    """One draft-and-verify round."""

    accepted: int  # drafted tokens the target accepted AND that were emitted (bonus not counted)
    emitted: int  # tokens added to the output this round (after EOS / budget truncation)
    tree_size: int  # live drafted nodes before the prune
    verified_size: int  # drafted nodes sent to the target
    steps: tuple[StepRecord, ...]
    times: dict[str, float]  # seconds per component
    mid_lag: int = 0  # committed tokens the mid drafter's cache lacked at the round's start
    prompt_blocks: int = 0  # blocks of the prompt's top-m rows the round's n-gram steps computed
    mode: str = TREE  # TREE, DRAFTLESS or OFF (module docstring)

    def __post_init__(self) -> None:
        if self.mode not in (TREE, DRAFTLESS, OFF):
            raise ValueError(f"RoundStats.mode must be {TREE!r}, {DRAFTLESS!r} or {OFF!r}, got {self.mode!r}")

    @property
    def mid_calls(self) -> tuple[bool, ...]:
        return tuple(s.used_mid for s in self.steps)

    @property
    def is_ar_step(self) -> bool:
        """Whether the target ran this round as one autoregressive step (no tree verify)."""
        return self.mode != TREE


@dataclass(frozen=True)
class RoundModes:
    """Per request: how its rounds ran, and how often speculation was switched off."""

    speculated: int  # rounds that drafted (TREE and DRAFTLESS)
    verified: int  # of those, rounds whose tree the target verified (TREE)
    draftless: int  # rounds that drafted nothing and ran as an autoregressive step
    switched_off: int  # rounds run as an autoregressive step with speculation off (OFF)
    switch_offs: int  # runs of OFF rounds: the times speculation was turned off

    @property
    def as_ar(self) -> int:
        """Rounds the target ran as one autoregressive step."""
        return self.draftless + self.switched_off

    @classmethod
    def of(cls, rounds: Sequence[RoundStats]) -> RoundModes:
        modes = [r.mode for r in rounds]
        offs = sum(m == OFF and (i == 0 or modes[i - 1] != OFF) for i, m in enumerate(modes))
        n_off, n_draftless = modes.count(OFF), modes.count(DRAFTLESS)
        return cls(len(modes) - n_off, modes.count(TREE), n_draftless, n_off, offs)
