"""Per-request switch-off: a policy wrapper that turns speculation off while it does not pay.

Contract: `SwitchOff` wraps a TreeGraft scheduler (a fixed schedule or a learned one) and answers
every drafting step as the wrapped one does. Before each round the loop asks it
(`speculate_round`) whether the round drafts at all; after it, the wrapper reads the round's
statistics (`round_done`) and prices them with a `RoundPricer` (the pair's measured cost model:
decoder/deploy/round_prices.py builds one from a LatencyProfile). A round's realised excess over AR is
its priced ms minus the ms of as many autoregressive steps as it emitted tokens; a round with a
positive excess is *losing*.

- On: every round speculates. Speculation is switched off after `patience` losing rounds in a row,
  or as soon as the request's summed excess passes its allowance
  `overhead x (AR ms of every token so far) + grace_steps x AR step` (gains bank credit).
- Off: rounds run as one autoregressive step each (decoder/core/decode.py OFF rounds, priced as
  exactly one AR step, so they add no excess). After `backoff` such rounds one round probes, and
  only where the allowance still has room for a loss as large as the last one seen. A probe that
  wins turns speculation back on (the backoff starts again from `backoff`); one that loses keeps it
  off and doubles the wait, up to `backoff_max`.

So a request's priced cost stays within about (1 + overhead) x AR's: its excess is at most the
allowance plus one round's loss (the round that crossed it, or a probe that lost more than the
last loss seen). The counts (`SwitchOffReport`) and the rounds' modes (decoder/core/outcome.py
RoundModes) show what it did. State is per generation: ``reset`` runs at every `generate` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from decoder.core.policies import (
    AR,
    DDTREE,
    Scheduler,
    StepContext,
    decision_taken,
    parse_policy,
    start_generation,
)
from decoder.core.records import OFF, RoundStats
from decoder.deploy.round_prices import ProfilePricer

if TYPE_CHECKING:
    from decoder.deploy.deployment import Deployment
    from decoder.deploy.latency import LatencyProfile


class RoundPricer(Protocol):
    """Priced ms of a round and of one autoregressive step, from one cost model."""

    @property
    def ar_ms(self) -> float: ...

    def round_ms(self, stats: RoundStats) -> float: ...


@dataclass(frozen=True)
class SwitchOffRule:
    """When speculation goes off and when it is tried again (module docstring)."""

    patience: int = 2  # losing rounds in a row that switch speculation off
    backoff: int = 4  # rounds off before the first probe
    backoff_max: int = 256  # the longest wait between probes
    overhead: float = 0.03  # excess over AR a request may carry, as a share of AR's ms
    grace_steps: float = 2.0  # extra allowance, in AR steps (lets a request's first rounds run)

    def __post_init__(self) -> None:
        for name in ("patience", "backoff", "backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SwitchOffRule.{name} must be an integer >= 1, got {value!r}")
        if self.backoff_max < self.backoff:
            raise ValueError(f"SwitchOffRule.backoff_max ({self.backoff_max}) < backoff ({self.backoff})")
        for name in ("overhead", "grace_steps"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value < float("inf")):
                raise ValueError(f"SwitchOffRule.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class SwitchOffReport:
    """One request's switch-off decisions and its priced standing against AR."""

    rounds_speculated: int  # rounds that drafted (probes included)
    rounds_off: int  # rounds run as one AR step with speculation off
    switch_offs: int  # times speculation was turned off (a probe that lost turns it off again)
    probes: int  # rounds that tried speculation again after a wait
    priced_ms: float  # the rounds' priced ms
    ar_priced_ms: float  # AR's priced ms for the same tokens

    @property
    def priced_ratio(self) -> float:
        """Priced cost over AR's for the same tokens (1.0 for a request with no round)."""
        return self.priced_ms / self.ar_priced_ms if self.ar_priced_ms > 0 else 1.0


class SwitchOff:
    """A TreeGraft scheduler that keeps speculation off for a request while it costs more than AR."""

    def __init__(
        self,
        inner: str | Scheduler,
        pricer: RoundPricer,
        rule: SwitchOffRule | None = None,
        depth: int | None = None,
    ) -> None:
        """`inner`: a scheduler, or a policy name ('all-small', a bit string) parsed at `depth`."""
        if inner in (AR, DDTREE):
            raise ValueError(f"SwitchOff wraps a TreeGraft schedule, not {inner!r}")
        if isinstance(inner, str):
            if depth is None:
                raise ValueError(f"SwitchOff({inner!r}) needs the tree depth to parse the policy")
            inner = parse_policy(inner, depth)  # type: ignore[assignment]
        if not callable(inner):
            raise TypeError(f"SwitchOff wraps a scheduler (a callable), got {type(inner).__name__}")
        if not pricer.ar_ms > 0:
            raise ValueError(f"the pricer's AR step must cost > 0 ms, got {pricer.ar_ms!r}")
        self.inner: Scheduler = inner  # type: ignore[assignment]
        self.pricer = pricer
        self.rule = rule or SwitchOffRule()
        self.reset()

    def reset(self) -> None:
        """A new request: speculation on, nothing counted; the wrapped scheduler resets too."""
        start_generation(self.inner)
        self._on = True
        self._wait = 0  # rounds still to run off before the next probe may start
        self._backoff = self.rule.backoff
        self._probing = False
        self._losing = 0  # losing rounds in a row while on
        self._last_loss = 0.0
        self._excess = 0.0
        self._ar_ms = 0.0
        self._priced = 0.0
        self._counts = {"speculated": 0, "off": 0, "switch_offs": 0, "probes": 0}

    def __call__(self, ctx: StepContext) -> bool:
        return bool(self.inner(ctx))

    @property
    def decided(self) -> bool:
        """Whether the wrapped scheduler's last answer was a decision
        (decoder.core.policies.decision_taken)."""
        return decision_taken(self.inner)

    @property
    def speculating(self) -> bool:
        return self._on

    def _allowance(self) -> float:
        return self.rule.overhead * self._ar_ms + self.rule.grace_steps * self.pricer.ar_ms

    def speculate_round(self) -> bool:
        """Whether the next round drafts: on, or off with the wait over and room for a probe."""
        if self._on:
            return True
        if self._wait > 0:
            self._wait -= 1
            return False
        if self._excess + self._last_loss > self._allowance():
            return False  # a probe now could carry the request past its allowance
        self._probing = True
        self._counts["probes"] += 1
        return True

    def round_done(self, stats: RoundStats) -> None:
        """Price the finished round and settle the state (module docstring)."""
        cost = float(self.pricer.round_ms(stats))
        loss = cost - stats.emitted * self.pricer.ar_ms
        self._priced += cost
        self._ar_ms += stats.emitted * self.pricer.ar_ms
        self._excess += loss
        if stats.mode == OFF:
            self._counts["off"] += 1
            return
        self._counts["speculated"] += 1
        losing = loss > 0
        if losing:
            self._last_loss = loss
        if self._probing:
            self._probing = False
            if losing:
                self._backoff = min(2 * self._backoff, self.rule.backoff_max)
                self._wait = self._backoff
                self._counts["switch_offs"] += 1
            else:
                self._on, self._losing, self._backoff = True, 0, self.rule.backoff
            return
        self._losing = self._losing + 1 if losing else 0
        if self._losing >= self.rule.patience or self._excess > self._allowance():
            self._on, self._losing, self._wait = False, 0, self._backoff
            self._counts["switch_offs"] += 1

    def report(self) -> SwitchOffReport:
        """The current request's counts and priced totals."""
        c = self._counts
        return SwitchOffReport(
            c["speculated"], c["off"], c["switch_offs"], c["probes"], self._priced, self._ar_ms
        )


def priced_switch_off(
    policy: str | Scheduler, profile: LatencyProfile, depth: int, rule: SwitchOffRule | None = None
) -> str | SwitchOff:
    """``policy`` (parse_policy's forms, at ``depth`` steps) wrapped in SwitchOff, every round priced
    with ``profile``; AR, which has nothing to switch off, stays AR. A fresh wrapper per call (it
    resets at every generate)."""
    if policy == AR:
        return AR
    inner = parse_policy(policy, depth)
    return SwitchOff(inner, ProfilePricer.for_policy(profile, inner), rule)


def for_deployment(deployment: Deployment, rule: SwitchOffRule | None = None) -> str | SwitchOff:
    """A deployment bundle's policy (decoder.deploy.deployment.load_deployment) in :func:`priced_switch_off`,
    priced with the bundle's latency profile."""
    return priced_switch_off(deployment.policy, deployment.profile, deployment.config.tree.depth, rule)
