"""Who decides, before each drafting step, whether the mid drafter is called.

A scheduler is any callable taking a `StepContext` and returning True to invoke the mid drafter.
Fixed schedules are strings of D bits, step 1 first ("10101" = mid at steps 1, 3, 5); a schedule id
0..2^D-1 maps to bits with bit k-1 = step k (see `schedule_bits`). 'ddtree' is no schedule: it
names the GRAFT path, a DDTree from a block proposer's marginals (decoder/generate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from decoder.tree import DraftTree


@dataclass(frozen=True)
class RuntimeContext:
    """Per-generation facts a learned scheduler may use (timings measured at warm-up)."""

    prompt_tokens: int
    target_ms: float
    mid_ms: float


@dataclass
class BuildState:
    """Construction state before a step: the tree, P_k (mid-visited), N_k (newest), last frontier."""

    tree: DraftTree
    visited: set[int] = field(default_factory=set)
    newest: list[int] = field(default_factory=lambda: [0])
    frontier: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StepContext:
    """Everything a scheduler may look at before step `step` (1-based) of `depth`."""

    step: int
    depth: int
    history: tuple[bool, ...]
    state: BuildState
    runtime: RuntimeContext | None
    mid_lag: int = 0  # committed tokens the mid drafter's cache lacked at the round's start


class Scheduler(Protocol):
    def __call__(self, ctx: StepContext) -> bool: ...


def decision_taken(scheduler: object) -> bool:
    """Whether the scheduler's last answer was a decision it paid for (tree signals + model). A
    scheduler that answers some steps for free (decoder.scheduler.LearnedScheduler skipping the
    rest of a round) says so with ``decided = False``; any other scheduler decides every step."""
    return bool(getattr(scheduler, "decided", True))


@dataclass(frozen=True)
class FixedSchedule:
    """Invoke the mid drafter at the steps whose bit is set."""

    bits: tuple[bool, ...]

    def __call__(self, ctx: StepContext) -> bool:
        return self.bits[ctx.step - 1]

    @property
    def text(self) -> str:
        return "".join("1" if b else "0" for b in self.bits)


AR = "ar"
DDTREE = "ddtree"
NAMED = {"all-small": "0", "all-mid": "1"}


def schedule_bits(schedule_id: int, depth: int) -> tuple[bool, ...]:
    """Bits of a schedule id, step 1 first: bit k-1 of the id says whether step k calls mid."""
    if not 0 <= schedule_id < 2**depth:
        raise ValueError(f"schedule_id must be in [0, {2**depth}), got {schedule_id}")
    return tuple(bool((schedule_id >> k) & 1) for k in range(depth))


def parse_policy(policy: str | Callable[[StepContext], bool], depth: int) -> str | Scheduler:
    """'ar' and 'ddtree' stay as they are; 'all-small', 'all-mid' and bit strings become FixedSchedule."""
    if callable(policy):
        return policy
    if policy in (AR, DDTREE):
        return policy
    text = NAMED[policy] * depth if policy in NAMED else policy
    if len(text) != depth or set(text) - {"0", "1"}:
        raise ValueError(
            f"policy {policy!r}: expected 'ar', 'ddtree', 'all-small', 'all-mid' or a string of "
            f"{depth} bits like {'10' * (depth // 2) + '1' * (depth % 2)!r}"
        )
    return FixedSchedule(tuple(c == "1" for c in text))


def uses_mid(policy: str | Scheduler) -> bool:
    """Whether the TreeGraft construction calls the mid drafter ('ddtree' has its own proposer)."""
    return not (policy in (AR, DDTREE) or (isinstance(policy, FixedSchedule) and not any(policy.bits)))
