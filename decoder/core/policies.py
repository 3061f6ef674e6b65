"""Who decides, before each drafting step, whether the mid drafter is called.

A scheduler is any callable taking a `StepContext` and returning True to invoke the mid drafter.
Fixed schedules are strings of D bits, step 1 first ("10101" = mid at steps 1, 3, 5); a schedule id
0..2^D-1 maps to bits with bit k-1 = step k (see `schedule_bits`). 'ddtree' is no schedule: it
names the GRAFT path, a DDTree from a block proposer's marginals (decoder/core/decode.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from decoder.core.records import RoundStats
from decoder.core.tree import DraftTree


@dataclass(frozen=True)
class RuntimeContext:
    """Per-generation facts a learned scheduler may use (timings measured at warm-up)."""

    prompt_tokens: int
    target_ms: float
    mid_ms: float


class Lookahead(Protocol):
    """What the n-gram lookahead reads of the small drafter (decoder.core.ngram.NgramDrafter)."""

    @property
    def max_n(self) -> int: ...

    def match_length(self, suffix: Sequence[int]) -> int: ...


@dataclass
class BuildState:
    """Construction state before a step: the tree, P_k (mid-visited), N_k (newest), last frontier;
    and what a small step would draft from: the round's n-gram drafter and the committed tokens'
    tail (its last ngram_max_n; None / empty where no small step can run, e.g. a bare tree)."""

    tree: DraftTree
    visited: set[int] = field(default_factory=set)
    newest: list[int] = field(default_factory=lambda: [0])
    frontier: list[int] = field(default_factory=list)
    ngram: Lookahead | None = None
    tail: tuple[int, ...] = ()

    def copy(self) -> BuildState:
        """An independent copy of the tree and the node sets (the drafter is shared, read only)."""
        return BuildState(
            self.tree.copy(), set(self.visited), list(self.newest), list(self.frontier), self.ngram, self.tail
        )


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
    scheduler that answers some steps for free (decoder.deploy.scheduler.LearnedScheduler skipping the
    rest of a round) says so with ``decided = False``; any other scheduler decides every step."""
    return bool(getattr(scheduler, "decided", True))


class RoundBackoff:
    """Cross-round exponential backoff, one generation's state (the rule of
    decoder.deploy.scheduler.LearnedScheduler's ``skip_rounds_max`` and of the offline walk that chooses
    it, features.round_states.backoff_walk_pct).

    A round is idle when it decided and was never engaged: its scheduler calls :meth:`engaged` when
    a decision calls the mid drafter, or (the scheduler's idle margin) comes close to calling it.
    After k idle rounds in a row, the next min(2^k - 1, cap) rounds are skipped whole (no
    decisions); the round after a skip-run decides again; an engaged round sets k back to 0. cap 0:
    never skip. Skipped rounds neither count as idle nor reset k.
    """

    def __init__(self, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"backoff cap (skip_rounds_max) must be an integer >= 0, got {cap!r}")
        self.cap = cap
        self.reset()

    def reset(self) -> None:
        self._idle = 0  # k, capped where 2^k - 1 >= cap (so it never grows without bound)
        self._left = 0  # rounds still to skip in the current skip-run
        self._open = False  # a deciding round is open; its outcome is settled when the next starts
        self._engaged = False

    def start_round(self) -> bool:
        """Begin a round (settling the one before it); True when this round is skipped whole."""
        if self._open:
            if self._engaged:
                self._idle = 0
            else:
                self._idle = min(self._idle + 1, self.cap.bit_length())
                self._left = min(2**self._idle - 1, self.cap)
        skipped = self._left > 0
        self._left -= skipped
        self._open, self._engaged = not skipped, False
        return skipped

    def engaged(self) -> None:
        """The open round is not idle (it called the mid drafter, or came within the margin)."""
        self._engaged = True


def start_generation(scheduler: object) -> None:
    """Tell a scheduler that a new generation (one prompt) starts: one that carries state from
    round to round (decoder.deploy.scheduler.LearnedScheduler's cross-round backoff) has ``reset()``, which
    is called here; any other scheduler is left as it is. ``generate`` and the policy replay call
    this once per prompt, so the state never leaks from one prompt into the next."""
    reset = getattr(scheduler, "reset", None)
    if callable(reset):
        reset()


def round_speculates(scheduler: object) -> bool:
    """Whether the round about to start drafts a tree. A scheduler that can keep speculation off for
    a request (decoder.deploy.switch_off.SwitchOff) answers with ``speculate_round()``, called once per
    round before any drafting; any other scheduler speculates every round."""
    ask = getattr(scheduler, "speculate_round", None)
    return bool(ask()) if callable(ask) else True


def round_done(scheduler: object, stats: RoundStats) -> None:
    """Hand the finished round's statistics to a scheduler that watches them (``round_done``)."""
    tell = getattr(scheduler, "round_done", None)
    if callable(tell):
        tell(stats)


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
ADAPTIVE = "adaptive"  # the online adaptive rule (decoder/core/adaptive.py): 'adaptive[:MARGIN:PROBE]'
NAMED = {"all-small": "0", "all-mid": "1"}


def schedule_bits(schedule_id: int, depth: int) -> tuple[bool, ...]:
    """Bits of a schedule id, step 1 first: bit k-1 of the id says whether step k calls mid."""
    if not 0 <= schedule_id < 2**depth:
        raise ValueError(f"schedule_id must be in [0, {2**depth}), got {schedule_id}")
    return tuple(bool((schedule_id >> k) & 1) for k in range(depth))


def parse_policy(policy: str | Callable[[StepContext], bool], depth: int) -> str | Scheduler:
    """'ar', 'ddtree' and 'adaptive[:MARGIN:PROBE]' stay as they are (the decode builds the adaptive
    rule: decoder/generate.py); 'all-small', 'all-mid' and bit strings become FixedSchedule."""
    if callable(policy):
        return policy
    if policy in (AR, DDTREE) or is_adaptive(policy):
        return policy
    text = NAMED[policy] * depth if policy in NAMED else policy
    if len(text) != depth or set(text) - {"0", "1"}:
        raise ValueError(
            f"policy {policy!r}: expected 'ar', 'ddtree', 'adaptive', 'all-small', 'all-mid' or a string "
            f"of {depth} bits like {'10' * (depth // 2) + '1' * (depth % 2)!r}"
        )
    return FixedSchedule(tuple(c == "1" for c in text))


def is_adaptive(policy: object) -> bool:
    """Whether a policy is the adaptive rule's name ('adaptive' or 'adaptive:MARGIN:PROBE')."""
    return isinstance(policy, str) and (policy == ADAPTIVE or policy.startswith(ADAPTIVE + ":"))


def uses_mid(policy: str | Scheduler) -> bool:
    """Whether the TreeGraft construction calls the mid drafter ('ddtree' has its own proposer); a
    wrapper (decoder.deploy.switch_off.SwitchOff) answers for the policy it wraps (``inner``)."""
    inner = getattr(policy, "inner", None)
    if inner is not None:
        return uses_mid(inner)
    return not (policy in (AR, DDTREE) or (isinstance(policy, FixedSchedule) and not any(policy.bits)))
