"""One round of tree construction: D steps, each small (n-gram) or mid, with the paper's rules.

- Small step: pool = newest nodes N_k with their stored scores; frontier = top-W; each frontier node
  gets up to m n-gram continuation chains.
- Mid step: the mid drafter re-scores the tree; pool = every live node it has not visited yet
  (extended grafting) or N_k (ablation), ranked by the fresh scores; frontier = top-W; each gets the
  mid's top-m children; with extended grafting P_{k+1} = P_k U pool.
- Grafting: non-destructive (same token merges, nothing removed) or overwrite (ablation: a
  re-expanded node loses its old children first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from decoder.core.config import Grafting, TreeConfig
from decoder.core.mid import MidCall, MidDrafter
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import BuildState, RuntimeContext, Scheduler, StepContext, decision_taken
from decoder.core.records import StepRecord
from decoder.core.tree import DraftTree, top_w


class MidLike(Protocol):
    """What a mid step needs from the mid drafter."""

    def rescore(self, tree: DraftTree, committed: list[int]) -> MidCall: ...

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]: ...


@dataclass
class RoundBuilder:
    """Grows one tree per round; timings go into `times` (seconds, keys ngram/mid/scheduler)."""

    config: TreeConfig
    ngram: NgramDrafter
    mid: MidDrafter | None
    clock: Callable[[], float]

    def build(
        self,
        committed: list[int],
        scheduler: Scheduler,
        times: dict[str, float],
        runtime: RuntimeContext | None = None,
    ) -> tuple[DraftTree, list[StepRecord]]:
        state = self.new_state(committed)
        history: list[bool] = []
        records = []
        lag = self.mid_lag(committed)
        for k in range(1, self.config.depth + 1):
            t0 = self.clock()
            ctx = StepContext(k, self.config.depth, tuple(history), state, runtime, lag)
            use_mid = bool(scheduler(ctx))
            decided = decision_taken(scheduler)
            t1 = self.clock()
            times["scheduler"] += t1 - t0
            if use_mid:
                if self.mid is None:
                    raise ValueError("the schedule calls the mid drafter but the pair has none")
                rec = self.mid_step(state, committed, k)
                times["mid"] += self.clock() - t1
            else:
                rec = self.small_step(state, committed, k)
                times["ngram"] += self.clock() - t1
            history.append(use_mid)
            records.append(rec if decided else replace(rec, decided=False))
        return state.tree, records

    def new_state(self, committed: list[int]) -> BuildState:
        """A round's state before step 1: the bare tree over the last committed token, with the
        n-gram drafter and the committed tail a small step would draft from."""
        return BuildState(
            tree=DraftTree(committed[-1]), ngram=self.ngram, tail=tuple(committed[-self.config.ngram_max_n :])
        )

    def mid_lag(self, committed: list[int]) -> int:
        """Committed tokens (root excluded) the mid drafter's cache lacks: what its next call must
        catch up; all of them when no mid drafter runs (the collectors' convention for All-Small)."""
        return len(committed) - 1 - (self.mid.n_committed if isinstance(self.mid, MidDrafter) else 0)

    def _graft(self, state: BuildState, parent: int, chains: list[tuple], step: int) -> list[int]:
        """Attach token chains under parent; return the nodes that did not exist before."""
        tree = state.tree
        if not tree.alive[parent]:  # overwrite mode: an ancestor in the same frontier replaced it
            return []
        if self.config.grafting is Grafting.OVERWRITE and chains:
            tree.remove_children(parent)
        created = []
        for tokens, logps in chains:
            u = parent
            for tok, lp in zip(tokens, logps, strict=True):
                u, is_new = tree.add_child(u, tok, lp, step)
                if is_new:
                    created.append(u)
        return created

    def small_step(self, state: BuildState, committed: list[int], k: int) -> StepRecord:
        tree = state.tree
        cfg = self.config
        pool = [v for v in state.newest if tree.alive[v]]
        frontier = self._frontier(tree, pool)
        tail = committed[-cfg.ngram_max_n :]
        created: list[int] = []
        for v in frontier:
            suffix = (tail + tree.path_tokens(v))[-cfg.ngram_max_n :]
            chains = [(c.tokens, c.logps) for c in self.ngram.propose(suffix, self._children)]
            created += self._graft(state, v, chains, k)
        return self._advance(state, pool, frontier, created, used_mid=False)

    def mid_step(
        self, state: BuildState, committed: list[int], k: int, mid: MidLike | None = None
    ) -> StepRecord:
        """A mid step; `mid` overrides the builder's drafter (replay hands in per-branch state)."""
        mid = mid or self.mid
        assert mid is not None
        tree = state.tree
        cfg = self.config
        call = mid.rescore(tree, committed)
        if cfg.extended_grafting and not cfg.sequential:
            pool = [v for v in tree.live_nodes() if v not in state.visited]
        else:
            pool = [v for v in state.newest if tree.alive[v]]
        frontier = self._frontier(tree, pool)
        ids, lps = mid.top_children(frontier, self._children)
        created: list[int] = []
        for v, toks, vals in zip(frontier, ids, lps, strict=True):
            created += self._graft(state, v, [((t,), (lp,)) for t, lp in zip(toks, vals, strict=True)], k)
        if cfg.extended_grafting:
            state.visited.update(pool)
        return self._advance(state, pool, frontier, created, True, call.n_catch_up, call.n_tree_nodes)

    @property
    def _children(self) -> int:
        return 1 if self.config.sequential else self.config.topk

    def _frontier(self, tree: DraftTree, pool: list[int]) -> list[int]:
        """Top-W of the pool; in a sequential cascade, the tip of the single draft chain."""
        if not self.config.sequential:
            return top_w(tree, pool, self.config.width)
        live = tree.live_nodes()
        return [max(live, key=lambda v: (tree.depths[v], v))]

    @staticmethod
    def _advance(
        state: BuildState,
        pool: list[int],
        frontier: list[int],
        created: list[int],
        used_mid: bool,
        catch_up: int = 0,
        tree_tokens: int = 0,
    ) -> StepRecord:
        newest = set(state.newest)
        record = StepRecord(
            used_mid=used_mid,
            pool_size=len(pool),
            frontier_size=len(frontier),
            historical_picks=sum(v not in newest for v in frontier),
            created=len(created),
            mid_catch_up=catch_up,
            mid_tree_tokens=tree_tokens,
        )
        state.frontier = frontier
        state.newest = created
        return record
