"""Signal selection: the closed-form grouped OOF ridge equals scikit-learn's; ranking is complete."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from features.selection import (
    SelectionData,
    choose,
    fold_systems,
    nested_choice,
    proxy_columns,
    proxy_matrix,
    rank_subsets,
)

NAMES = tuple(f"s{i}" for i in range(10))


@pytest.fixture(scope="module")
def data() -> SelectionData:
    rng = np.random.default_rng(0)
    n = 300
    signals = rng.normal(size=(n, 10))
    act = rng.integers(0, 2, size=n).astype(float)
    y = np.column_stack([signals[:, 2] + act * signals[:, 5], 0.5 * signals[:, 7]]) + 0.1 * rng.normal(
        size=(n, 2)
    )
    return SelectionData(rng.normal(size=(n, 3)), signals, act, y, rng.integers(0, 5, size=n))


def test_closed_form_equals_sklearn_ridge(data):
    cols = proxy_columns(data, [1, 2, 5])
    x = proxy_matrix(data)[:, cols]
    ours = np.empty_like(data.targets)
    for test, system in fold_systems(data):
        ours[test] = system.predict(cols, 3.0)
    ref = np.empty_like(data.targets)
    for f in np.unique(data.folds):
        test = data.folds == f
        model = make_pipeline(StandardScaler(), Ridge(alpha=3.0)).fit(x[~test], data.targets[~test])
        ref[test] = model.predict(x[test])
    np.testing.assert_allclose(ours, ref, atol=1e-9)


def test_ranking_covers_every_subset_and_finds_the_informative_one(data):
    ranking = rank_subsets(data, NAMES, [3], alpha=1.0)
    assert len(ranking) == 120 and len({s.signals for s in ranking}) == 120
    assert choose(ranking, 3).signals == ("s2", "s5", "s7")
    assert all(a.nmae <= b.nmae for a, b in itertools.pairwise(ranking))
    by_signals = {s.signals: s for s in ranking}
    # Every subset missing one planted signal is worse than every subset holding all three.
    full = [s.nmae for s in ranking if {"s2", "s5", "s7"} <= set(s.signals)]
    partial = [s.nmae for s in ranking if not {"s2", "s5", "s7"} <= set(s.signals)]
    assert full == [by_signals[("s2", "s5", "s7")].nmae] and full[0] < min(partial)
    noise = by_signals[("s0", "s1", "s3")]
    assert noise.nmae > 0.9  # signals unrelated to the targets: about the constant predictor (1.0)


def test_a_subset_score_is_the_mean_of_its_targets_pooled_oof_nmae(data):
    """Re-derived with scikit-learn: pooled out-of-fold predictions, NMAE per target, then the mean."""
    score = rank_subsets(data, NAMES, [3], alpha=1.0)[0]
    cols = proxy_columns(data, [NAMES.index(n) for n in score.signals])
    x = proxy_matrix(data)[:, cols]
    pred = np.empty_like(data.targets)
    for f in np.unique(data.folds):
        test = data.folds == f
        model = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(x[~test], data.targets[~test])
        pred[test] = model.predict(x[test])
    per_target = [
        np.mean(np.abs(data.targets[:, t] - pred[:, t]))
        / np.mean(np.abs(data.targets[:, t] - data.targets[:, t].mean()))
        for t in range(2)
    ]
    assert score.per_target == pytest.approx(per_target, rel=1e-9)
    assert score.nmae == pytest.approx(np.mean(per_target), rel=1e-9)


def test_size_zero_is_the_no_signal_baseline(data):
    ranking = rank_subsets(data, NAMES, [0, 3], alpha=1.0)
    base = choose(ranking, 0)
    assert base.signals == () and np.isfinite(base.nmae)
    assert choose(ranking, 3).nmae < base.nmae  # the targets live in the signals


def test_nested_choice_never_looks_at_the_held_out_fold(data):
    nested = nested_choice(data, NAMES, 3, alpha=1.0)
    assert len(nested.by_fold) == 5 and all(s.signals == ("s2", "s5", "s7") for s in nested.by_fold)
    # Fold 0 made uninformative: its own subset cannot change, the other folds' may (they train on it).
    rng = np.random.default_rng(1)
    held = data.folds == 0
    signals = data.signals.copy()
    signals[held] = rng.normal(size=(held.sum(), 10))
    targets = data.targets.copy()
    targets[held] = signals[held][:, [0, 1]] * 5
    scrambled = SelectionData(data.base, signals, data.is_invoke, targets, data.folds)
    again = nested_choice(scrambled, NAMES, 3, alpha=1.0)
    assert again.by_fold[0] == nested.by_fold[0]
    assert again.outer.nmae > nested.outer.nmae  # fold 0's predictions are now scored on noise
