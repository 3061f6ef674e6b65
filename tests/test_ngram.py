"""The n-gram drafter: incremental index, longest-suffix matching, finite target-based scores."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoder.core.config import TreeConfig
from decoder.core.ngram import NgramDrafter, NgramIndex, TargetLogpCache
from decoder.core.verify import TopLogps


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(0, 60))
def test_incremental_index_equals_rebuilt(tokens, cut):
    inc = NgramIndex(max_n=5)
    inc.extend(tokens[:cut])
    inc.extend(tokens[cut:])
    full = NgramIndex(max_n=5)
    full.extend(tokens)
    assert inc.table == full.table
    for key, ends in full.table.items():
        for e in ends:
            assert tuple(tokens[e - len(key) + 1 : e + 1]) == key


@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=50), st.lists(st.integers(0, 3), min_size=1, max_size=7)
)
def test_longest_match_is_longest(tokens, suffix):
    idx = NgramIndex(max_n=5)
    idx.extend(tokens)
    hits = idx.longest_match(suffix)

    def occurs_with_successor(n: int) -> bool:
        key = suffix[-n:]
        return any(tokens[e - n + 1 : e + 1] == key for e in range(n - 1, len(tokens) - 1))

    longest = max((n for n in range(1, min(5, len(suffix)) + 1) if occurs_with_successor(n)), default=0)
    if longest == 0:
        assert hits == []
    else:
        assert hits and all(tokens[e - longest + 1 : e + 1] == suffix[-longest:] for e in hits)


def filled(tokens: list[int], m: int = 3) -> NgramDrafter:
    """A drafter whose cache says: after position i, token (i % 7) has log-prob -0.5, others lower."""
    d = NgramDrafter(max_n=5, max_matches=8, chain_len=3)
    d.commit(tokens)
    rows = [[i % 7, 100, 101][:m] for i in range(len(tokens) - 1)]
    d.cache.set_rows(0, rows, [[-0.5, -2.0, -3.0][:m] for _ in rows])
    return d


def test_chains_copy_continuations_most_recent_first_with_finite_scores():
    ctx = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2]
    d = filled(ctx)
    chains = d.propose([1, 2], limit=10)
    firsts = [c.tokens[0] for c in chains]
    assert set(firsts) == {3}  # "1 2" is followed by 3 both times; distinct first tokens only
    assert chains[0].tokens == (3, 5, 6)  # the most recent occurrence wins
    assert all(math.isfinite(x) for c in chains for x in c.logps)
    # token 3 at position 7 is scored by the cache row of position 6: 6 % 7 = 6 != 3 -> floor -3.0
    assert chains[0].logps[0] == -3.0


def test_scores_use_cached_target_logps_and_refresh():
    ctx = [5, 6, 7, 5, 6]
    d = filled(ctx)
    (chain,) = d.propose([5, 6], limit=10)
    assert chain.tokens == (7, 5, 6)
    assert chain.logps == (-3.0, -3.0, -3.0)
    d.cache.set_rows(1, [[7, 0, 1]], [[-0.25, -1.0, -4.0]])  # verification refreshed position 1
    (chain,) = d.propose([5, 6], limit=10)
    assert chain.logps[0] == -0.25


def test_limit_and_no_match():
    d = filled([1, 2, 1, 3, 1, 4, 1])
    assert [c.tokens[0] for c in d.propose([1], limit=2)] != []
    assert len(d.propose([1], limit=2)) == 2
    assert d.propose([8, 8], limit=5) == []


def test_cache_floor_is_min_of_top_m():
    cache = TargetLogpCache()
    cache.set_rows(0, [[4, 5]], [[-0.1, -2.5]])
    assert cache.logp(0, 4) == -0.1 and cache.logp(0, 99) == -2.5


def test_min_n_drafts_only_from_matches_of_that_length():
    ctx = [1, 2, 3, 4, 9, 8, 2, 7]
    d = filled(ctx)
    # the suffix "... 5 2" matches only the unigram "2", which was followed by 3 and by 7
    assert {c.tokens[0] for c in d.propose([5, 2], limit=10)} == {3, 7}
    d.min_n = 2
    assert d.propose([5, 2], limit=10) == []  # no bigram "5 2" in the context: nothing to draft
    assert [c.tokens[0] for c in d.propose([1, 2], limit=10)] == [3]  # the bigram "1 2" still drafts
    tree = TreeConfig(ngram_min_n=2)
    assert NgramDrafter.for_tree(tree).min_n == 2
    with pytest.raises(ValueError, match=r"ngram_min_n must be in \[1, ngram_max_n=5\]"):
        TreeConfig(ngram_min_n=6)


class _Rows:
    """Rows of positions 0..count-1 in blocks of 4: position p's row is {p: -1.0, p + 1: -2.0}."""

    def __init__(self, count: int) -> None:
        self.start, self.count, self.asked = 0, count, []

    def block(self, position: int):
        lo = position - position % 4
        self.asked.append(lo)
        ps = range(lo, min(lo + 4, self.count))
        return TopLogps(lo, [[p, p + 1] for p in ps], [[-1.0, -2.0]] * len(ps))


def test_score_cache_computes_a_source_block_on_first_read_only():
    cache, src = TargetLogpCache(), _Rows(10)
    cache.set_source(src)
    cache.set_rows(10, [[7]], [[-0.5]])  # the first verify's row, after the prompt's
    assert cache.logp(10, 7) == -0.5 and src.asked == []
    assert cache.logp(5, 5) == -1.0 and cache.logp(6, 7) == -2.0 and cache.logp(7, 99) == -2.0  # floor
    assert src.asked == [4]  # positions 5-7 share the block 4..7
    assert cache.logp(9, 9) == -1.0 and src.asked == [4, 8]
    cache.truncate(3)
    with pytest.raises(IndexError):
        cache.logp(5, 5)
