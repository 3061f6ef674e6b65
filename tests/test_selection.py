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
    nmae,
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
    assert nmae(data.targets[:, 0], np.full(len(data.targets), data.targets[:, 0].mean())) == pytest.approx(
        1.0
    )
