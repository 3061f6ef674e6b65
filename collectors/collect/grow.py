"""Growing the schedules' trees at many round starts of one prompt together: the batched replay.

Contract: :func:`grow_starts` grows, at every given round start, the tree of every schedule prefix
asked for (all 2^D schedules, or the prefixes of a set), step by step in lockstep over the starts.
A start's small steps read only what decoding from that start would read: an n-gram drafter forked
from the prompt's at that start (``NgramDrafter.fork``: its index holds the committed text T[:start]
and nothing after it; the target's rows are shared, read through the prompt's `ReadLog`). Its mid
steps read the prompt's `MidForest` (collectors/collect/forest.py), which serves every start's mid
calls of one step with one batched forward. Each branch is the one the per-start replay
(collectors/collect/replay.py ``Replayer._all_schedules``) grows, with the same counts; its mid rows
agree with that replay's up to float rounding.

``keep(start, branch)`` sees every branch after every step (the policy replay keeps them in its
StepMemo, so that no policy replayed on the prompt runs a forward of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from collectors.collect.branch import Branch, read_log
from collectors.collect.forest import ForestBranchMid, MidForest
from decoder.core.config import TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.ngram import NgramDrafter
from decoder.core.state import step_signals

Bits = tuple[bool, ...]


@dataclass
class _Start:
    """One round start being grown: its committed text, its builder (over its own n-gram view) and
    the branches of the current step."""

    start: int
    committed: list[int]
    builder: RoundBuilder
    level: list[Branch]


def fork_starts(
    config: TreeConfig, ngram: NgramDrafter, text: Sequence[int], starts: Iterable[int]
) -> dict[int, RoundBuilder]:
    """A builder per start over ``ngram`` forked at that start. ``ngram`` holds a prefix of ``text``
    no longer than the first start and is extended to the last start (it is the prompt's drafter:
    the caller commits nothing to it afterwards)."""
    out = {}
    for start in sorted(starts):
        have = len(ngram.index.tokens)
        if have > start:
            raise ValueError(f"the n-gram drafter holds {have} tokens, past round start {start}")
        ngram.commit(text[have:start])
        out[start] = RoundBuilder(config, ngram.fork(), None, lambda: 0.0)
    return out


def grow_starts(
    config: TreeConfig,
    builders: dict[int, RoundBuilder],
    forest: MidForest | None,
    text: Sequence[int],
    prefixes: set[Bits] | None = None,
    keep: Callable[[int, Branch], None] | None = None,
) -> dict[int, list[Branch]]:
    """Per start (the keys of ``builders``, from :func:`fork_starts`), the branches after the last
    step: every schedule, or the schedules whose every prefix is in ``prefixes``. No forest: the
    pair has no mid drafter, and only schedules without a mid step grow."""
    width, depth = config.width, config.depth
    grown = [
        _Start(s, list(text[:s]), b, [Branch((), b.new_state(list(text[:s])), ForestBranchMid(), (), ())])
        for s, b in sorted(builders.items())
    ]
    log = read_log(grown[0].builder) if grown else None
    for k in range(1, depth + 1):
        invoking: list[tuple[_Start, Branch]] = []
        for g in grown:
            assert log is not None
            log.take()
            nxt = []
            for b in g.level:
                sig = (*b.signals, step_signals(b.state, width))
                if prefixes is None or (*b.bits, False) in prefixes:
                    small = b.state.copy()
                    g.builder.small_step(small, g.committed, k)
                    nxt.append(Branch((*b.bits, False), small, b.mid, b.calls, sig, b.blocks | log.take()))
                if forest is not None and (prefixes is None or (*b.bits, True) in prefixes):
                    mid = b.mid.copy()
                    invoking.append((g, Branch((*b.bits, True), b.state.copy(), mid, b.calls, sig, b.blocks)))
            g.level = nxt
        if invoking:
            assert forest is not None
            forest.rescore([(g.start, b.state.tree, b.mid) for g, b in invoking])  # type: ignore[misc]
        for g, b in invoking:
            rec = g.builder.mid_step(b.state, g.committed, k, b.mid)
            g.level.append(
                Branch(b.bits, b.state, b.mid, (*b.calls, rec.mid_tree_tokens), b.signals, b.blocks)
            )
        if keep is not None:
            for g in grown:
                for b in g.level:
                    keep(g.start, b)
    return {g.start: g.level for g in grown}
