"""What one schedule prefix has built at a round start (`Branch`), and the score cache that logs
which prompt rows its small steps read (`ReadLog`).

Shared by every replay: all schedules at one start (collectors/collect/replay.py), all starts of a
prompt at once (collectors/collect/grow.py), one policy (collectors/collect/policy_replay.py) and
the budget sweep (collectors/pricing/budget_sweep.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from collectors.collect.branch_mid import BranchMid
from decoder.core.construct import RoundBuilder
from decoder.core.ngram import TargetLogpCache
from decoder.core.policies import BuildState
from decoder.core.tensors import ROW_BLOCK


class ReadLog(TargetLogpCache):
    """A score cache holding every row up front that logs the blocks of the prompt's rows read
    (position // ROW_BLOCK, positions before `prompt_len`): where decoding would compute them."""

    def __init__(self, prompt_len: int) -> None:
        super().__init__()
        self.prompt_len = prompt_len
        self._read: set[int] = set()

    def logp(self, position: int, token: int) -> float:
        if position < self.prompt_len:
            self._read.add(position // ROW_BLOCK)
        return super().logp(position, token)

    def take(self) -> frozenset[int]:
        """The blocks read since the last take."""
        out = frozenset(self._read)
        self._read.clear()
        return out


def read_log(builder: RoundBuilder) -> ReadLog:
    """The builder's n-gram score cache, which replay makes a ReadLog (Replayer.ngram_with_rows)."""
    log = builder.ngram.cache
    if not isinstance(log, ReadLog):
        raise TypeError("replay's n-gram drafter must come from Replayer.ngram_with_rows (a ReadLog cache)")
    return log


@dataclass(frozen=True)
class Branch:
    bits: tuple[bool, ...]
    state: BuildState
    mid: BranchMid
    calls: tuple[int, ...]  # tree nodes forwarded per mid call so far
    signals: tuple[tuple[float, ...], ...]
    blocks: frozenset[int] = frozenset()  # blocks of the prompt's rows its small steps read so far

    def mid_fed(self, accepted: Sequence[int]) -> int:
        """How many leading ``accepted`` tree nodes the mid drafter fed (it keeps their KV); -1
        when it was not called this round."""
        if not self.calls:
            return -1
        fed = 0
        while fed < len(accepted) and accepted[fed] in self.mid.scores.row:
            fed += 1
        return fed
