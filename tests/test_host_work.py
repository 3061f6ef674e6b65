"""Per-round host work does not grow with the context: counted, never timed.

Python work is counted as the lines the interpreter executes (sys.settrace), tensor work as the
elements the non-view aten ops of KV compaction write (a TorchDispatchMode). A context that repeats
the same text 20 or 1000 times drafts the very same trees, so any per-round work proportional to
the context (a scan over every occurrence of an n-gram, a Python list of context length turned into
an index, ...) shows up as a different count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from decoder.core.config import TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import FixedSchedule
from decoder.core.tensors import compact_cache
from decoder.core.timing import no_clock, zero_times

PERIOD = [7, 3, 9, 3, 4, 7, 3, 5, 1, 3, 9, 2, 8, 6]  # repeated n-grams with several continuations


def count_lines(fn: Callable[[], object]) -> tuple[int, object]:
    """(Python lines executed while fn runs, fn's result)."""
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return tracer

    sys.settrace(tracer)
    try:
        out = fn()
    finally:
        sys.settrace(None)
    return lines, out


def periodic_drafter(repeats: int, cfg: TreeConfig) -> tuple[NgramDrafter, list[int]]:
    """A drafter over PERIOD * repeats whose cached target rows depend only on the phase."""
    text = PERIOD * repeats
    d = NgramDrafter.for_tree(cfg)
    d.commit(text)
    rows = [[PERIOD[(i + 1) % len(PERIOD)], 0, 10] for i in range(len(text) - 1)]
    d.cache.set_rows(0, rows, [[-0.5 - 0.01 * (i % len(PERIOD)), -2.0, -3.0] for i in range(len(text) - 1)])
    return d, text


def reference_propose(tokens: list[int], d: NgramDrafter, suffix: list[int], limit: int) -> list:
    """The drafter's contract, by scanning every occurrence: longest n-gram of the suffix with a
    successor, its occurrences most recent first, one per distinct next token."""
    last = len(tokens) - 1
    for n in range(min(d.max_n, len(suffix)), 0, -1):
        ends = [e for e in range(n - 1, last) if tokens[e - n + 1 : e + 1] == list(suffix[-n:])]
        if ends:
            break
    else:
        return []
    seen, chains = set(), []
    for end in reversed(ends):
        if tokens[end + 1] in seen:
            continue
        seen.add(tokens[end + 1])
        stop = min(end + 1 + d.chain_len, last + 1)
        chains.append(
            (
                tuple(tokens[end + 1 : stop]),
                tuple(d.cache.logp(j - 1, tokens[j]) for j in range(end + 1, stop)),
            )
        )
        if len(chains) >= d.max_matches:
            break
    chains.sort(key=lambda c: -c[1][0])
    return chains[:limit]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=2, max_size=80),
    st.lists(st.integers(0, 4), min_size=1, max_size=6),
    st.integers(1, 4),
    st.integers(1, 6),
)
def test_propose_equals_a_scan_of_every_occurrence(tokens, suffix, max_matches, limit):
    d = NgramDrafter(max_n=4, max_matches=max_matches, chain_len=3)
    cut = len(tokens) // 3
    d.commit(tokens[:cut])  # extended in two pieces, as decoding does
    d.commit(tokens[cut:])
    rows = [[(7 * i) % 5, (3 * i + 1) % 5] for i in range(len(tokens) - 1)]
    d.cache.set_rows(0, rows, [[-0.1 * (i % 4), -2.0 - 0.1 * (i % 3)] for i in range(len(tokens) - 1)])
    got = [(c.tokens, c.logps) for c in d.propose(suffix, limit)]
    assert got == reference_propose(tokens, d, suffix, limit)


def test_propose_work_does_not_grow_with_the_occurrences():
    cfg = TreeConfig()
    counts, outs = [], []
    for repeats in (20, 1000):
        d, _ = periodic_drafter(repeats, cfg)
        lines, chains = count_lines(lambda d=d: d.propose([9, 3, 4, 7, 3], 10))
        counts.append(lines)
        outs.append([c.tokens for c in chains])
    assert outs[0] == outs[1] and outs[0]
    assert counts[0] == counts[1], f"propose ran {counts} lines for 20 / 1000 repeats of the text"


def test_a_rounds_host_work_does_not_grow_with_the_context():
    """Tree construction (n-gram steps, scheduler, grafting), pruning and the n-gram bookkeeping
    after verification execute the same Python lines at 20 and at 1000 repeats of the text."""
    cfg = TreeConfig()
    counts, trees = [], []
    for repeats in (20, 1000):
        d, text = periodic_drafter(repeats, cfg)
        builder = RoundBuilder(cfg, d, None, no_clock)
        schedule = FixedSchedule((False,) * cfg.depth)
        committed = list(text)
        new = PERIOD[len(text) % len(PERIOD) :][:3]

        def one_round(builder=builder, committed=committed, d=d, new=new, schedule=schedule):
            tree, _ = builder.build(committed, schedule, zero_times())
            pruned = tree.prune(cfg.budget)
            start = len(committed) - 1
            d.cache.set_rows(start, [[1, 2, 3]] * len(new), [[-0.1, -1.0, -2.0]] * len(new))
            d.commit(new)
            committed.extend(new)
            return pruned.tree

        lines, tree = count_lines(one_round)
        counts.append(lines)
        trees.append((tree.tokens, tree.parents))
    assert trees[0] == trees[1] and len(trees[0][0]) > 10
    assert counts[0] == counts[1], f"a round ran {counts} lines for 20 / 1000 repeats of the text"


class WrittenElements(TorchDispatchMode):
    """Counts the elements every non-view aten op produces (what it writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor):
                    self.written += t.numel()
        return out


def filled_cache(context: int, layers: int = 3, heads: int = 2, dim: int = 8) -> DynamicCache:
    cache = DynamicCache()
    g = torch.Generator().manual_seed(context)
    for i in range(layers):
        kv = torch.randn(2, 1, heads, context, dim, generator=g)
        cache.update(kv[0], kv[1], i)
    return cache


def test_compaction_writes_only_the_kept_rows_whatever_the_context():
    tree_rows, accepted = 64, [0, 3, 9, 20]
    written = []
    for context in (256, 4096):
        cache = filled_cache(context + tree_rows)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        rows = [context + r for r in accepted]
        with WrittenElements() as mode:
            compact_cache(cache, context, rows)
        written.append(mode.written)
        keep = torch.tensor([*range(context), *rows])
        assert cache.get_seq_length() == context + len(rows)
        for layer, (k, v) in zip(cache.layers, before, strict=True):
            assert torch.equal(layer.keys, k.index_select(-2, keep))
            assert torch.equal(layer.values, v.index_select(-2, keep))
    # 3 moved rows x 2 heads x 8 dims, gathered and written, for keys and values of 3 layers, + index
    assert written[0] == written[1] <= 2 * 3 * 2 * (2 * 3 * 8) + 3, written
