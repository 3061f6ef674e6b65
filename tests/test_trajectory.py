"""A schedule's trajectory bookkeeping (collectors/collect/trajectory.py): accepted paths, the walk
from start to start with execute mode's accounting, and the arrival a round-table start is priced after."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from collectors.collect.trajectory import BranchOutcome, Walk, accepted_along, arrival, arrival_lag
from decoder.core.tree import DraftTree


def outcome(accepted: int, calls: tuple[int, ...] = (), fed: int = -1, blocks: frozenset[int] = frozenset()):
    return BranchOutcome(accepted, accepted + 1, calls, fed, (), prompt_blocks=blocks)


def test_the_accepted_path_follows_the_text_and_stops_at_a_mismatch():
    tree = DraftTree(7)
    a, _ = tree.add_child(0, 1, -0.1)
    b, _ = tree.add_child(a, 2, -0.1)
    tree.add_child(b, 9, -0.1)
    tree.add_child(0, 5, -0.1)
    text = [7, 7, 1, 2, 3]
    assert accepted_along(tree, text, 2) == [a, b]
    assert accepted_along(tree, text, 4) == []


def test_a_walk_stops_at_its_limit_and_charges_each_prompt_block_once():
    walk = Walk()
    assert walk.advance(outcome(3, blocks=frozenset({0, 1})), 10, 9, (False,)) == 14
    assert walk.advance(outcome(3, blocks=frozenset({1, 2})), 14, 9, (False,)) == 18
    assert walk.advance(outcome(5), 18, 9, (False,)) is None  # 4 + 4 emitted: 1 left of the limit
    assert [r.emitted for r in walk.rounds] == [4, 4, 1]
    assert [r.accepted for r in walk.rounds] == [3, 3, 1]
    assert [r.prompt_blocks for r in walk.rounds] == [2, 1, 0]
    assert walk.emitted == 9


def test_a_mid_call_catches_up_the_lag_and_keeps_the_fed_accepted_nodes():
    walk = Walk()
    walk.advance(outcome(2), 10, 100, (False,))  # no mid call: the lag grows
    assert walk.lag_at(13) == 12
    walk.advance(outcome(4, calls=(6,), fed=3), 13, 100, (True,))
    first, second = walk.rounds
    assert (first.mid_catch_up, first.mid_lag) == (0, 9)
    assert (second.mid_catch_up, second.mid_lag) == (12, 12)
    assert walk.mid_committed == 16 and walk.lag_at(18) == 1


@given(st.lists(st.integers(0, 50), min_size=1, max_size=15))
def test_a_start_is_priced_after_the_first_walk_whose_lag_is_the_lower_median(lags):
    assert arrival_lag(lags) == sorted(lags)[(len(lags) - 1) // 2]
    walks = [Walk(mid_committed=100 - lag) for lag in lags]  # lag at start 101: 100 - mid_committed
    came = arrival(walks, 101)
    assert came.lag_at(101) == arrival_lag(lags)
    assert came is next(w for w in walks if w.lag_at(101) == arrival_lag(lags))
