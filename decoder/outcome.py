"""What a generation returns: per-round statistics, the result, and the exact stopping rules.

Shared by every decoding path (decoder/generate.py, decoder/block_decode.py), so each records its
rounds the same way and stops right after the first EOS or at max_new_tokens, never later.

A round is one of three kinds (`RoundStats.mode`): a tree verified by the target (TREE); a round
whose tree held no drafted node after the prune, run as one autoregressive step (DRAFTLESS: drafting
ran, verification did not); or a round in which a switch-off wrapper (decoder/switch_off.py) kept
speculation off, one autoregressive step with no drafting at all (OFF). `RoundModes` counts them
per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoder.construct import StepRecord
from decoder.timing import zero_times

TREE = "tree"
DRAFTLESS = "draftless"
OFF = "off"


def first_round_start(prompt: Sequence[int]) -> int:
    """Committed tokens at a decode's first round: the prompt and the token its prefill yields."""
    return len(prompt) + 1


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


@dataclass(frozen=True)
class GenerationResult:
    new_tokens: list[int]
    rounds: list[RoundStats]
    prefill_s: float
    wall_s: float  # prefill + decoding
    stopped_at_eos: bool
    cpu_s: float = 0.0  # this process's CPU seconds over the call, every thread (generate sets it)

    @property
    def decoded_tokens(self) -> int:
        """Tokens after the first, which the prefill yields: what the rounds (or the baseline's
        one-token steps) produced. Priced decoding time covers these."""
        return max(0, len(self.new_tokens) - 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_tokens) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def modes(self) -> RoundModes:
        """How the rounds ran: verified trees, autoregressive steps, switch-offs."""
        return RoundModes.of(self.rounds)

    @property
    def mean_accepted_length(self) -> float:
        return float(np.mean([r.accepted for r in self.rounds])) if self.rounds else 0.0

    def component_times(self) -> dict[str, float]:
        total = zero_times()
        for r in self.rounds:
            for k, v in r.times.items():
                total[k] += v
        return total


class Output:
    """Collects emitted tokens and applies the exact stopping rules."""

    def __init__(self, limit: int, eos: tuple[int, ...]) -> None:
        self.tokens: list[int] = []
        self.limit = limit
        self.eos = set(eos)
        self.done = False
        self.hit_eos = False

    def emit(self, tokens: list[int]) -> int:
        n = 0
        for t in tokens:
            if self.done:
                break
            self.tokens.append(int(t))
            n += 1
            if t in self.eos:
                self.done = self.hit_eos = True
            elif len(self.tokens) >= self.limit:
                self.done = True
        return n
