"""A schedule's outcome at one round start, and its trajectory from round start to round start.

Contract: an outcome (`BranchOutcome`) is what one schedule's round yields from one start, read off
its tree (`accepted_along`: the accepted path at temperature 0; `small_frontier`: what its small
steps expanded). A trajectory (`Walk`) moves L -> L + A + 1 through the outcomes of its schedule,
with execute mode's stopping rule, mid catch-up accounting and prompt-row blocks (a round is charged
the blocks no earlier round of the trajectory read). A round-table start is priced after one
arriving trajectory (`arrival`: the one whose mid lag is the lower median of the arrivals'). The
all-schedules replay (collectors/collect/replay.py), the policy replay and the budget sweep share
this bookkeeping; none of it runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.collect.records import RoundRecord
from decoder.core.tree import ROOT, DraftTree


@dataclass(frozen=True)
class BranchOutcome:
    """One schedule from one round start."""

    accepted: int
    verified_nodes: int  # including the root
    mid_tree_tokens: tuple[int, ...]
    fed_accepted: int  # accepted nodes whose KV the mid drafter keeps; -1 when it was not called
    signals: tuple[tuple[float, ...], ...]
    tree_nodes: int = 0  # live tree nodes before the prune, the root included
    small_frontier: int | None = None  # frontier nodes the small steps expanded in all
    prompt_blocks: frozenset[int] = frozenset()  # blocks of the prompt's rows its small steps read


@dataclass(frozen=True)
class PromptReplay:
    rounds: dict[int, list[RoundRecord]]  # schedule id -> the trajectory's rounds
    n_tokens: dict[int, int]  # tokens the rounds emitted (the prefill's first token excluded)
    starts: dict[int, list[BranchOutcome]]  # round-table starts: committed length -> all schedules
    start_lags: dict[int, int] = field(default_factory=dict)  # round-table start -> its mid lag
    # round-table start -> the prompt-row blocks read before it (by the arrival whose lag it takes)
    start_blocks: dict[int, frozenset[int]] = field(default_factory=dict)


def small_frontier(tree: DraftTree, bits: tuple[bool, ...], width: int, sequential: bool = False) -> int:
    """Frontier nodes the round's small steps expanded, read off its final tree: step k's pool is
    the live nodes step k - 1 created (the root before step 1), of which it expands the top `width`
    (a sequential cascade: always its one tip). Exact with non-destructive grafting (nothing dies)."""
    if sequential:
        return len(bits) - sum(bits)
    created = [0] * (len(bits) + 1)
    for v, step in enumerate(tree.created_step):
        if tree.alive[v] and step < len(created):
            created[step] += 1
    return sum(min(width, created[k - 1]) for k, mid in enumerate(bits, start=1) if not mid)


def accepted_along(tree: DraftTree, text: list[int], start: int) -> list[int]:
    """Nodes of the longest tree path spelling text[start:], root excluded."""
    path, v, i = [], ROOT, start
    while i < len(text):
        child = tree.children[v].get(text[i])
        if child is None or not tree.alive[child]:
            break
        path.append(child)
        v, i = child, i + 1
    return path


@dataclass
class Walk:
    """One schedule's trajectory through the round starts, with execute mode's accounting."""

    emitted: int = 0  # tokens its rounds emitted (``limit`` in advance counts these only)
    mid_committed: int = 0  # committed tokens the mid drafter's cache would hold in execute mode
    rounds: list[RoundRecord] = field(default_factory=list)
    blocks_read: set[int] = field(default_factory=set)  # prompt-row blocks its rounds computed

    def lag_at(self, start: int) -> int:
        """Committed tokens (root excluded) the mid drafter's cache lacks at round start `start`."""
        return (start - 1) - self.mid_committed

    def advance(
        self,
        o: BranchOutcome,
        start: int,
        limit: int,
        bits: tuple[bool, ...],
        decisions: int | None = None,
    ) -> int | None:
        """Record the round (``decisions``: the scheduler's, when it took fewer than one per step)."""
        take = min(o.accepted + 1, limit - self.emitted)
        catch_up, lag = 0, self.lag_at(start)
        fresh = o.prompt_blocks - self.blocks_read  # computed this round: read by no earlier round
        self.blocks_read |= fresh
        if o.mid_tree_tokens:
            catch_up = (start - 1) - self.mid_committed
            self.mid_committed = start + o.fed_accepted
        self.rounds.append(
            RoundRecord(
                accepted=min(o.accepted, take),
                emitted=take,
                verified_nodes=o.verified_nodes,
                mid_tree_tokens=o.mid_tree_tokens,
                mid_catch_up=catch_up,
                small_steps=len(bits) - sum(bits),
                signals=o.signals,
                tree_nodes=o.tree_nodes,
                small_frontier=o.small_frontier,
                mid_lag=lag,
                decisions=decisions,
                prompt_blocks=len(fresh),
            )
        )
        self.emitted += take
        return None if self.emitted >= limit else start + o.accepted + 1


def arrival_lag(lags: list[int]) -> int:
    """A round-table start's mid lag: the lower median of the lags (committed tokens the mid
    drafter's cache lacks) of the schedules whose trajectories arrive there. Different schedules
    arrive with different lags; the median is one that real trajectories have at this start."""
    ordered = sorted(lags)
    return ordered[(len(ordered) - 1) // 2]


def arrival(walks: list[Walk], start: int) -> Walk:
    """The arriving trajectory a round-table start is priced after: the first (in the given order)
    whose lag is `arrival_lag` of them all; its prompt-row blocks are the ones read before the start."""
    lag = arrival_lag([w.lag_at(start) for w in walks])
    return next(w for w in walks if w.lag_at(start) == lag)
