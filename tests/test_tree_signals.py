"""The scheduler's state features: definitions checked on hand-built trees."""

from __future__ import annotations

import math
import random

import pytest

from decoder.core.ngram import NgramDrafter
from decoder.core.policies import BuildState, RuntimeContext
from decoder.core.state import SIGNAL_NAMES, context_features, history_features, step_signals, tree_signals
from decoder.core.tree import DraftTree


def test_signals_on_a_hand_built_tree():
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 1, -0.5)  # depth 1
    tree.add_child(0, 2, -1.0)  # b, depth 1
    c, _ = tree.add_child(a, 3, -0.5)  # depth 2, score -1.0
    d, _ = tree.add_child(c, 4, -0.1)  # depth 3, score -1.1
    state = BuildState(tree, visited={0, a}, newest=[c, d], frontier=[])
    sig = dict(zip(SIGNAL_NAMES, tree_signals(state, width=2), strict=True))
    # frontier = top-2 of newest {c: -1.0, d: -1.1} = [c, d]; preview = top-2 of unvisited {b, c, d}
    # by score: b -1.0 (depth 1) ties c -1.0 (depth 2): shallower first -> [b, c]
    assert sig["frontier_size"] == 2 and sig["tree_size"] == 4
    assert sig["frontier_mean_depth"] == 2.5
    assert sig["frontier_leaf_ratio"] == 0.5  # c has a child, d does not
    assert sig["frontier_mean_score"] == pytest.approx(-1.05)
    assert sig["preview_mean_score"] == pytest.approx(-1.0)
    assert sig["preview_overlap_ratio"] == 0.5  # c is in the frontier
    assert sig["preview_history_share"] == 0.5  # b's depth 1 is not a frontier depth
    assert sig["preview_depth_delta"] == pytest.approx(1.5 - 2.5)
    assert sig["preview_collapse_debt"] == pytest.approx(1.0)


def test_signals_before_the_first_step():
    sig = tree_signals(BuildState(DraftTree(7)), width=10)
    assert dict(zip(SIGNAL_NAMES, sig, strict=True)) == {
        "frontier_mean_depth": 0.0, "frontier_leaf_ratio": 1.0, "frontier_mean_score": 0.0,
        "frontier_size": 1.0, "tree_size": 0.0, "preview_mean_score": 0.0, "preview_overlap_ratio": 1.0,
        "preview_history_share": 0.0, "preview_depth_delta": 0.0, "preview_collapse_debt": 0.0,
    }  # fmt: skip


def test_history_and_context_features():
    assert history_features(1, 5, (), 0, 0.0) == (0.2, 0.0, 0, 0, 0, 0, 0)
    # no call yet this round: the lag at the round's start is what a call now catches up
    assert history_features(3, 5, (False, False), 99, 0.4) == pytest.approx(
        (0.6, 0.4, 0, 0, 0, 0, math.log(100))
    )
    # a call at step 1 caught the mid drafter up: no lag afterwards, whatever it was
    assert history_features(4, 5, (True, False, True), 99, 0.0) == (0.8, 0.0, 1, 0, 1, 0, 0)
    assert len(history_features(5, 5, (True,) * 4, 7, 1.0)) == 7  # 17 inputs with 6 signals and context
    ctx = context_features(RuntimeContext(prompt_tokens=99, target_ms=20.0, mid_ms=5.0))
    assert ctx == pytest.approx((math.log(100), 20.0, 5.0, math.log(4)))


def _drafter(text: list[int], min_n: int = 1) -> NgramDrafter:
    ngram = NgramDrafter(max_n=4, max_matches=4, chain_len=3, min_n=min_n)
    ngram.commit(text)
    ngram.cache.set_rows(0, [[0]] * len(text), [[-1.0]] * len(text))  # edge scores for propose
    return ngram


def test_the_lookahead_is_the_match_a_small_step_would_draft_from():
    """Before step 1 (a bare root) the candidate signals are the same at every round start; the
    lookahead is n / max_n of the longest n-gram match of the committed tail, 0 where a small step
    drafts nothing, and it averages over the frontier's paths later in the round."""
    text = [5, 6, 7, 8, 9, 5, 6, 7]  # the tail 5 6 7 occurred before, followed by 8
    ngram = _drafter(text)
    root = BuildState(DraftTree(text[-1]), ngram=ngram, tail=tuple(text[-4:]))
    sig = step_signals(root, width=4)
    assert sig[: len(SIGNAL_NAMES)] == tree_signals(BuildState(DraftTree(7)), width=4)
    assert sig[-1] == pytest.approx(3 / 4)  # 5 6 7 matched (9 5 6 7 never occurred)
    fresh = [1, 2, 3, 4]  # nothing repeats: the drafter proposes nothing, the lookahead is 0
    bare = BuildState(DraftTree(4), ngram=_drafter(fresh), tail=tuple(fresh))
    assert _drafter(fresh).propose(fresh, 4) == [] and step_signals(bare, width=4)[-1] == 0.0
    assert step_signals(BuildState(DraftTree(7)), width=4)[-1] == 0.0  # no drafter: 0
    # one-token matches dropped (min_n = 2): the tail's last token 7 alone no longer counts
    single = [3, 7, 4, 9, 7]
    assert step_signals(BuildState(DraftTree(7), ngram=_drafter(single), tail=(4, 9, 7)), 4)[-1] == 1 / 4
    strict = BuildState(DraftTree(7), ngram=_drafter(single, min_n=2), tail=(4, 9, 7))
    assert step_signals(strict, 4)[-1] == 0.0
    # later in the round: the mean over the frontier's paths, each matched with the tail
    tree = DraftTree(text[-1])
    a, _ = tree.add_child(0, 8, -0.1)  # 5 6 7 8 occurred: n = 4
    b, _ = tree.add_child(0, 1, -0.2)  # 7 1 never occurred, 1 never did: n = 0
    grown = BuildState(tree, newest=[a, b], ngram=ngram, tail=tuple(text[-4:]))
    assert step_signals(grown, width=4)[-1] == pytest.approx((4 + 0) / (2 * 4))
    assert step_signals(grown, width=1)[-1] == pytest.approx(4 / 4)  # the frontier is a alone


def test_the_lookahead_is_positive_exactly_where_a_small_step_drafts():
    rng = random.Random(3)
    for _ in range(200):
        text = [rng.randrange(6) for _ in range(rng.randrange(2, 30))]
        min_n = rng.choice((1, 2))
        ngram = _drafter(text, min_n)
        state = BuildState(DraftTree(text[-1]), ngram=ngram, tail=tuple(text[-4:]))
        drafts = ngram.propose(text[-4:], 4)
        assert (step_signals(state, width=2)[-1] > 0) == bool(drafts)
