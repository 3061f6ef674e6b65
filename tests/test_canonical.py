"""Canonical states: the merge is order-independent and idempotent; 2^D - 1 states per report; folds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_collect import synthetic_tables

from features.canonical import canonicalize, merge_states
from features.folds import report_folds

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
rows = st.lists(
    st.tuples(
        st.sampled_from(["r0", "r1"]),
        st.integers(1, 3),
        st.sampled_from(["", "0", "1", "01"]),
        finite,
        finite,
    ),
    min_size=1,
    max_size=40,
)


def _merge(data, order):
    keys = [data[i][:3] for i in order]
    feats = np.array([data[i][3:] for i in order])
    return merge_states(keys, feats)


@settings(max_examples=60, deadline=None)
@given(rows, st.randoms(use_true_random=False))
def test_merge_is_order_independent(data, rnd):
    order = list(range(len(data)))
    rnd.shuffle(order)
    a, b = _merge(data, range(len(data))), _merge(data, order)
    assert a.keys == b.keys
    assert np.array_equal(a.features, b.features) and np.array_equal(a.weights, b.weights)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_merge_is_idempotent(data):
    once = _merge(data, range(len(data)))
    twice = merge_states(once.keys, once.features, once.weights)
    assert twice.keys == once.keys
    assert np.array_equal(twice.features, once.features) and np.array_equal(twice.weights, once.weights)
    assert once.weights.sum() == len(data)


@pytest.fixture(scope="module")
def actions() -> pa.Table:
    return synthetic_tables(n_reports=6, depth=5, seed=3)[0]


def test_31_states_per_report_and_shuffle_invariance(actions):
    tables = canonicalize(actions, depth=5, n_folds=5)
    states = tables.states.to_pydict()
    assert tables.states.num_rows == 6 * 31
    assert all(states["report_id"].count(r) == 31 for r in set(states["report_id"]))
    assert states["state_id"] == list(range(6 * 31))
    assert sum(states["n_rows"]) == actions.num_rows == tables.samples.num_rows
    perm = np.random.default_rng(0).permutation(actions.num_rows)
    shuffled = canonicalize(actions.take(pa.array(perm)), depth=5, n_folds=5)
    assert shuffled.states.equals(tables.states) and shuffled.samples.equals(tables.samples)
    # one state per (k, prefix): k = 1 has the empty prefix and 32 rows, k = 5 has 16 states of 2 rows
    first = [n for k, n in zip(states["step"], states["n_rows"], strict=True) if k == 1]
    assert set(first) == {32}


def test_incomplete_report_is_refused(actions):
    keep = pa.compute.invert(
        pa.compute.and_(pa.compute.equal(actions["step"], 5), pa.compute.equal(actions["prefix"], "0000"))
    )
    with pytest.raises(ValueError, match="expected 31"):
        canonicalize(actions.filter(keep), depth=5, n_folds=5)


def test_states_carry_the_stated_report_folds(actions):
    """canonicalize writes features.folds' assignment: a Latin square, not one dataset per fold."""
    tables = canonicalize(actions, depth=5, n_folds=5)
    frame = tables.states.select(["report_id", "pair_id", "dataset_id", "fold_id"]).to_pylist()
    want = report_folds(*(actions.column(c).to_pylist() for c in ("report_id", "pair_id", "dataset_id")), 5)
    assert {r["report_id"]: r["fold_id"] for r in frame} == want
    assert set(tables.samples.column("fold_id").to_pylist()) == set(want.values())


def test_merge_is_the_row_weighted_mean_and_copies_single_rows():
    rng = np.random.default_rng(5)
    keys = [("r0", 1, ""), ("r0", 2, "1"), ("r0", 1, ""), ("r1", 1, ""), ("r0", 1, "")]
    feats = rng.normal(size=(5, 3)) * 1e3
    weights = np.array([1, 4, 2, 7, 3])
    merged = merge_states(keys, feats, weights)
    assert merged.keys == [("r0", 1, ""), ("r0", 2, "1"), ("r1", 1, "")]
    assert merged.weights.tolist() == [6, 4, 7]
    want = (feats[[0, 2, 4]] * weights[[0, 2, 4], None]).sum(axis=0) / 6
    np.testing.assert_allclose(merged.features[0], want, rtol=1e-13)
    assert np.array_equal(merged.features[1], feats[1]) and np.array_equal(merged.features[2], feats[3])


def test_a_report_spanning_two_pairs_is_refused(actions):
    pair = pa.compute.if_else(
        pa.compute.equal(actions["schedule_id"], 3), pa.scalar("other"), actions["pair_id"]
    )
    tampered = actions.set_column(actions.schema.get_field_index("pair_id"), "pair_id", pair)
    with pytest.raises(ValueError, match="more than one pair or dataset"):
        canonicalize(tampered, depth=5, n_folds=5)
