"""What a generation returns (`GenerationResult`, its rounds' records from decoder/core/records.py)
and the exact stopping rules (`Output`).

Shared by every decoding path (decoder/core/decode.py, decoder/graft/decode.py), so each records
its rounds the same way and stops right after the first EOS or at max_new_tokens, never later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoder.core.records import RoundModes, RoundStats
from decoder.core.timing import zero_times


def first_round_start(prompt: Sequence[int]) -> int:
    """Committed tokens at a decode's first round: the prompt and the token its prefill yields."""
    return len(prompt) + 1


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
