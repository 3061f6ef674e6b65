"""Priced speedup of fixed schedules under every verification budget, from one replay per round start.

Contract (temperature 0, exact):
- `SweepReplayer` is collectors.collect.replay's Replayer whose `finish` keeps each round's full tree and
  turns its one greedy acceptance into the accepted length and verified size under every budget
  B <= tree.budget (decoder.core.budget.budget_sweep), as a `FullOutcome`.
- `sweep_prompt` builds every schedule's tree once at EVERY start position of the continuation and
  walks each (schedule, budget) trajectory start to start (L -> L + A_B + 1) with replay's own
  round accounting (`Walk`): each walk is the replay of decoding with `TreeConfig.budget = B`
  (benchmarks/bench_budget.py --check compares it with plain replay round for round).
- `sweep_pair` prices every walk with the pair's latency profile (fixed schedules: no decision
  cost) against AR priced as one-token target steps, summed over the prompts: a `PolicySweep` per
  policy (All-Small, All-Mid when the pair has a mid drafter).
- `PolicySweep.round_rule_speedup`: the priced speedup of decoding with a per-round budget rule
  (decoder.core.budget.verify_budget), walked over the same outcomes at every start: exact, like the
  budget walks. `round_rules` gives the candidates the budget stage tries.
- `saba_line`: SABA's cost line C(B) = B c_verify + c_fixed (GRAFT's rule, decoder.core.budget) through
  the mean drafting + tree work of the largest tree's rounds plus the profile's verify(B + 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from collectors.collect.branch import Branch
from collectors.collect.branch_mid import committed_kv
from collectors.collect.replay import Replayer, ReplayInputs
from collectors.collect.trajectory import BranchOutcome, Walk, accepted_along, small_frontier
from decoder.core.budget import budget_sweep, expected_gains, linear_cost, round_budget, saba_budget
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.outcome import first_round_start
from decoder.deploy.latency import LatencyProfile, RoundCounts, fed_before_calls, price_ar, price_round
from decoder.models.pair import ModelPair


@dataclass(frozen=True)
class FullOutcome:
    """One schedule from one round start, before any prune: outcomes under every budget."""

    accepted: np.ndarray  # [B] accepted drafted tokens under prune(B), B = 0..b_max
    kept: np.ndarray  # [B] verified nodes besides the root
    fed_full: int  # leading accepted nodes the mid drafter fed (-1: no mid call)
    calls: tuple[int, ...]
    tree_nodes: int
    frontier: int | None
    small_steps: int
    gains: np.ndarray  # [B] the per-round rule's expected accepted under B (decoder.core.budget)
    blocks: frozenset[int] = frozenset()  # prompt-row blocks its small steps read (the same under every B)

    def at(self, budget: int) -> BranchOutcome:
        a = int(self.accepted[budget])
        fed = -1 if self.fed_full < 0 else min(a, self.fed_full)
        return BranchOutcome(
            a, int(self.kept[budget]) + 1, self.calls, fed, (), self.tree_nodes, self.frontier, self.blocks
        )


class SweepReplayer(Replayer):
    """Replay whose `finish` keeps the full tree's outcome under every budget instead of one prune."""

    def finish(self, b: Branch, text: list[int], start: int) -> FullOutcome:  # type: ignore[override]
        tree, b_max = b.state.tree, self.config.tree.budget
        path = accepted_along(tree, text, start)
        sweep = budget_sweep(tree, path, b_max)
        fed = b.mid_fed(path)
        cfg = self.config.tree
        frontier = small_frontier(tree, b.bits, cfg.width, cfg.sequential)
        small = len(b.bits) - sum(b.bits)
        gains = expected_gains(tree, b_max)
        return FullOutcome(
            sweep.accepted, sweep.kept, fed, b.calls, tree.n_alive, frontier, small, gains, b.blocks
        )


def sweep_prompt(
    rep: SweepReplayer, prompt: list[int], budgets: list[int]
) -> tuple[dict[tuple[int, int], Walk], dict[int, list[FullOutcome]], int]:
    """Every (schedule, budget) trajectory of one prompt, and the outcomes from every start position
    of the continuation (each a round that a trajectory of some budget could begin there)."""
    inputs = rep.inputs(prompt)
    text, limit = inputs.text, inputs.limit
    keys = [(s, b) for s in range(len(rep.schedules)) for b in budgets]
    walks = {k: Walk() for k in keys}
    first, left = first_round_start(prompt), inputs.round_tokens
    at: dict[int, list[tuple[int, int]]] = {first: list(keys)} if left > 0 else {}
    if rep.batch_rows:
        grown = rep.grow_all(inputs, rep.prefixes()) if left > 0 else {}
        seen = {start: rep.outcomes_of(level, text, start) for start, level in grown.items()}
        del grown
    else:
        seen = _one_start_at_a_time(rep, inputs, first)
    for start in range(first, len(prompt) + limit):
        outcomes = seen[start]
        for s, b in at.pop(start, []):
            nxt = walks[s, b].advance(outcomes[s].at(b), start, left, rep.schedules[s])
            if nxt is not None:
                at.setdefault(nxt, []).append((s, b))
    emitted = {w.emitted for w in walks.values()}
    if emitted != {left} or at:
        raise RuntimeError(f"trajectories emitted {sorted(emitted)} tokens, expected {left}")
    return walks, seen, left


def _one_start_at_a_time(rep: SweepReplayer, inputs: ReplayInputs, first: int) -> dict[int, list]:
    """Every schedule's outcomes at every start of the continuation, grown one start at a time."""
    prompt, text, mid_kv = inputs.prompt, inputs.text, inputs.mid_kv
    ngram = rep.ngram_with_rows(prompt, text)
    builder = RoundBuilder(rep.config.tree, ngram, None, lambda: 0.0)
    ngram.commit(prompt)
    seen = {}
    for start in range(first, len(prompt) + inputs.limit):
        ngram.commit(text[len(ngram.index.tokens) : start])
        context = committed_kv(mid_kv, start - 1) if mid_kv is not None else None
        seen[start] = rep._all_schedules(builder, context, text, start, set(rep.schedules))
    return seen


def priced_ms(profile: LatencyProfile, walk: Walk) -> float:
    """A fixed schedule's trajectory priced with the profile (no scheduler decisions)."""
    return sum(price_round(profile, replace(r.counts(), decisions=0)) for r in walk.rounds)


Sample = tuple[FullOutcome, int]  # one replayed round start and the tokens left to emit from it


def round_counts(o: FullOutcome, budget: int) -> RoundCounts:
    """The priced counts of one replayed start under a budget (no mid catch-up: the round alone;
    no prompt-row blocks: a trajectory computes each block once, mostly in its first rounds, so a
    round's mean drafting cost leaves them out)."""
    b = o.at(budget)
    fed = fed_before_calls(b.mid_tree_tokens)
    return RoundCounts(
        b.verified_nodes, b.mid_tree_tokens, o.small_steps, 0, fed, b.tree_nodes, b.small_frontier
    )


def round_tokens(o: FullOutcome, left: int, budget: int) -> int:
    """Tokens a round from this start commits under a budget, capped at what is left to emit."""
    return min(int(o.accepted[budget]) + 1, left)


def saba_line(profile: LatencyProfile, samples: list[Sample], budgets: list[int]) -> tuple[float, float]:
    """(c_verify, c_fixed) of SABA's line through mean drafting + tree work of the rounds (under the
    largest budget) plus the profile's verify(B + 1), B over ``budgets``."""
    full = [round_counts(o, budgets[-1]) for o, _ in samples]
    draft_ms = float(
        np.mean([price_round(profile, c) - profile.round_verify_ms(c.verified_nodes) for c in full])
    )
    return linear_cost(budgets, [draft_ms + profile.round_verify_ms(b + 1) for b in budgets])


@dataclass(frozen=True)
class PolicySweep:
    """One fixed schedule of one pair under every budget 1..b_max, summed over the prompts."""

    budgets: tuple[int, ...]  # 1..b_max
    priced_ms: tuple[float, ...]  # per budget: the trajectories' priced ms
    ar_ms: float  # AR priced for the same tokens
    accepted: tuple[float, ...]  # per budget: mean accepted drafted tokens per round
    on_max: list[Sample]  # the round starts of the b_max trajectories
    every: list[Sample]  # every start position of every continuation
    bits: tuple[bool, ...] = ()  # the schedule
    # per prompt: (first round start, tokens to emit, this schedule's outcome at every start)
    starts: tuple[tuple[int, int, dict[int, FullOutcome]], ...] = ()

    def speedup(self, budget: int) -> float:
        return self.ar_ms / self.priced_ms[budget - 1]

    def best(self) -> int:
        """The budget of the highest priced speedup (the smallest on a tie)."""
        return max(self.budgets, key=lambda b: (self.speedup(b), -b))

    def saba(self, profile: LatencyProfile) -> tuple[int, float, float]:
        """SABA's budget and its line (c_verify, c_fixed) from the b_max trajectories' rounds."""
        c_verify, c_fixed = saba_line(profile, self.on_max, list(self.budgets))
        return saba_budget(c_verify, c_fixed, self.budgets[-1]), c_verify, c_fixed

    def round_rule_walks(self, rule: RoundRule) -> list[Walk]:
        """Per prompt, the trajectory of decoding with the per-round rule: at each round start the
        round verifies B_t = round_budget(scale x gains[0..cap], verify_ms, fixed_ms) nodes, as
        decoder.core.budget.verify_budget does with TreeConfig(budget=cap, verify_ms=..., ...)."""
        walks = []
        for start, limit, outcomes in self.starts:
            walk = Walk()
            at: int | None = start
            while at is not None:
                o = outcomes[at]
                b = round_budget(rule.gain_scale * o.gains[: rule.cap + 1], rule.verify_ms, rule.fixed_ms)
                at = walk.advance(o.at(b), at, limit, self.bits)
            walks.append(walk)
        return walks

    def round_rule_speedup(self, profile: LatencyProfile, rule: RoundRule) -> float:
        """Priced speedup over AR of decoding with the per-round rule (same prompts as the curve)."""
        return self.ar_ms / sum(priced_ms(profile, w) for w in self.round_rule_walks(rule))


@dataclass(frozen=True)
class RoundRule:
    """A per-round budget rule (TreeConfig's budget=cap, verify_ms, round_fixed_ms, round_gain_scale)."""

    cap: int
    verify_ms: tuple[float, ...]  # B = 0..cap: the profile's verify(B + 1)
    fixed_ms: float
    gain_scale: float

    def fields(self) -> dict[str, object]:
        """The budgets.json entry's ``round_budget`` (pricing/budget_file.py `pair_round_budget`)."""
        return {"verify_ms": list(self.verify_ms), "fixed_ms": self.fixed_ms, "gain_scale": self.gain_scale}


def gain_scale(sweep: PolicySweep, cap: int) -> float:
    """The least-squares scale s of accepted ~ s x gains[cap] over every start (the drafters'
    path probabilities calibrated to what the target accepts); 1 when no start has a gain."""
    acc = np.array([float(o.accepted[cap]) for o, _ in sweep.every])
    gains = np.array([float(o.gains[cap]) for o, _ in sweep.every])
    norm = float(gains @ gains)
    return float(acc @ gains) / norm if norm > 0 else 1.0


def round_rules(
    profile: LatencyProfile, sweep: PolicySweep, caps: Sequence[int], multipliers: Sequence[float]
) -> list[RoundRule]:
    """Candidate rules: each cap, each multiplier of the fitted `gain_scale`, with fixed_ms 0
    (verification alone) and the mean priced drafting + tree work of the policy's rounds at that
    cap (every start)."""
    rules = []
    for cap in caps:
        verify = tuple(profile.round_verify_ms(b + 1) for b in range(cap + 1))
        counts = [round_counts(o, cap) for o, _ in sweep.every]
        draft = float(
            np.mean([price_round(profile, c) - profile.round_verify_ms(c.verified_nodes) for c in counts])
        )
        fitted = gain_scale(sweep, cap)
        rules += [RoundRule(cap, verify, fixed, fitted * m) for fixed in (0.0, draft) for m in multipliers]
    return rules


def fixed_policies(pair: ModelPair, depth: int, schedules: Sequence[str] = ()) -> dict[str, tuple[bool, ...]]:
    """All-Small, and when the pair has a mid drafter All-Mid and the given mixed schedules (bit
    strings of length depth, "1" = call the mid drafter at that step)."""
    names = {"all-small": (False,) * depth, "all-mid": (True,) * depth}
    for bits in schedules:
        if len(bits) != depth or set(bits) - {"0", "1"}:
            raise ValueError(f"schedule {bits!r} is not a string of {depth} bits")
        names.setdefault(bits, tuple(b == "1" for b in bits))
    if pair.mid is None:
        names = {"all-small": names["all-small"]}
    return names


Check = Callable[[SweepReplayer, list[int], dict[tuple[int, int], Walk]], None]


def sweep_pair(
    pair: ModelPair,
    profile: LatencyProfile,
    prompts: list[list[int]],
    tree: TreeConfig,
    max_new_tokens: int,
    check: Check | None = None,
    schedules: Sequence[str] = (),
    batch_rows: int = 0,
) -> dict[str, PolicySweep]:
    """Every fixed policy of `fixed_policies` (with the mixed ``schedules``) under every budget
    1..tree.budget on ``prompts``; ``check`` (if given) sees the first prompt's walks.
    ``batch_rows``: Replayer's (0: one round start at a time)."""
    if not prompts:
        raise ValueError("sweep_pair needs at least one prompt")
    names = fixed_policies(pair, tree.depth, schedules)
    b_max = tree.budget
    config = DecodeConfig(max_new_tokens=max_new_tokens, tree=tree)
    rep = SweepReplayer(pair, config, list(names.values()), 0, profile, batch_rows)
    budgets = list(range(1, b_max + 1))
    ms = {(s, b): 0.0 for s in range(len(names)) for b in budgets}
    acc: dict[tuple[int, int], list[int]] = {k: [] for k in ms}
    on_max: list[list[Sample]] = [[] for _ in names]
    every: list[list[Sample]] = [[] for _ in names]
    starts: list[list[tuple[int, int, dict[int, FullOutcome]]]] = [[] for _ in names]
    ar_ms = 0.0
    rep.warm(prompts)
    for i, prompt in enumerate(prompts):
        walks, seen, limit = sweep_prompt(rep, prompt, budgets)
        if check is not None and i == 0:
            check(rep, prompt, walks)
        ar_ms += price_ar(profile, limit)
        first = first_round_start(prompt)
        end = first + limit
        for s in range(len(names)):
            every[s] += [(o[s], end - start) for start, o in seen.items()]
            starts[s].append((first, limit, {start: o[s] for start, o in seen.items()}))
            start = first
            for r in walks[s, b_max].rounds:
                on_max[s].append((seen[start][s], end - start))
                start += r.emitted
        for k, w in walks.items():
            ms[k] += priced_ms(profile, w)
            acc[k] += [r.accepted for r in w.rounds]
    return {
        name: PolicySweep(
            tuple(budgets),
            tuple(ms[s, b] for b in budgets),
            ar_ms,
            tuple(float(np.mean(acc[s, b])) for b in budgets),
            on_max[s],
            every[s],
            names[name],
            tuple(starts[s]),
        )
        for s, name in enumerate(names)
    }
