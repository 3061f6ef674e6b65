"""Choosing the tree signals: every k-of-10 subset scored by grouped out-of-fold NMAE of a cheap proxy.

NMAE (defined once, :func:`nmae`): mean absolute error divided by the mean absolute deviation of the
true values around their own mean, i.e. the MAE of always predicting the mean. 1.0 = no better than
the constant predictor, 0.0 = perfect. Out-of-fold predictions of all folds are pooled before
scoring, and the score of a subset is the mean NMAE over its targets (accepted length A and
log round latency).

Proxy: ridge regression (inputs standardized on the training folds; closed form, equal to
scikit-learn's StandardScaler + Ridge, but ~1000x cheaper across subsets) from
[context, history, subset signals, suffix encoding, is_invoke, is_invoke x (the same)] of the
(state, action, suffix) sample rows; the interaction block lets one linear model fit both branches.
Size 0 (context + history + suffix only) is a subset like any other: the baseline that shows
whether the tree signals help at all.

Nested selection (:func:`nested_choice`): for each outer fold f the subset is ranked on the other
folds only (their own folds as inner folds), so the subset behind fold f's out-of-fold
predictions never saw fold f; its outer NMAE scores that whole procedure honestly, unlike the
NMAE of the subset ranked best on all folds (optimistic: it is the minimum of many).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


def nmae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """MAE / mean |y - mean(y)|; see the module docstring. A constant y_true gives inf (or nan at 0)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    err = float(np.mean(np.abs(y_true - np.asarray(y_pred, dtype=np.float64))))
    scale = float(np.mean(np.abs(y_true - y_true.mean())))
    return err / scale if scale > 0 else (np.nan if err == 0 else np.inf)


@dataclass(frozen=True)
class SelectionData:
    """Sample rows for the proxy: base columns (context, history, suffix), candidate signals, action."""

    base: np.ndarray  # (n, b)
    signals: np.ndarray  # (n, 10)
    is_invoke: np.ndarray  # (n,) float 0/1
    targets: np.ndarray  # (n, t)
    folds: np.ndarray  # (n,) fold id per row


@dataclass(frozen=True)
class SubsetScore:
    signals: tuple[str, ...]
    nmae: float
    per_target: tuple[float, ...]


class _FoldSystem:
    """Per fold, the standardized Gram matrix of all proxy columns, so any subset solves a small system.

    Standardizing columns with training-fold stats does not depend on the subset, hence the Gram
    matrix of a subset is a sub-block of the full one. With centred inputs, ridge with an
    unpenalized intercept is w = (X'X + alpha I)^-1 X'(y - mean y), intercept = mean y: the same
    solution as scikit-learn's StandardScaler + Ridge(alpha) (a test checks it).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, test: np.ndarray) -> None:
        train = ~test
        mean, std = x[train].mean(axis=0), x[train].std(axis=0)
        std = np.where(std > 0, std, 1.0)
        xs = (x - mean) / std
        self.y_mean = y[train].mean(axis=0)
        self.gram = xs[train].T @ xs[train]
        self.xty = xs[train].T @ (y[train] - self.y_mean)
        self.x_test = xs[test]

    def predict(self, cols: np.ndarray, alpha: float) -> np.ndarray:
        g = self.gram[np.ix_(cols, cols)] + alpha * np.eye(len(cols))
        return self.x_test[:, cols] @ np.linalg.solve(g, self.xty[cols]) + self.y_mean


def proxy_matrix(data: SelectionData) -> np.ndarray:
    """All proxy columns: [base, signals, is_invoke, is_invoke x base, is_invoke x signals]."""
    main = np.concatenate([data.base, data.signals], axis=1)
    act = data.is_invoke[:, None]
    return np.concatenate([main, act, act * main], axis=1)


def proxy_columns(data: SelectionData, signal_cols: Sequence[int]) -> np.ndarray:
    """Indices into :func:`proxy_matrix` of the proxy that uses the given signals."""
    b, n_sig = data.base.shape[1], data.signals.shape[1]
    main = [*range(b), *(b + c for c in signal_cols)]
    return np.array([*main, b + n_sig, *(b + n_sig + 1 + c for c in main)])


def score_subset(
    data: SelectionData,
    systems: Sequence[tuple[np.ndarray, _FoldSystem]],
    columns: Sequence[int],
    names: Sequence[str],
    alpha: float,
) -> SubsetScore:
    """OOF NMAE of the proxy using the given signal columns (pooled over folds)."""
    cols = proxy_columns(data, columns)
    pred = np.empty_like(data.targets)
    for test, system in systems:
        pred[test] = system.predict(cols, alpha)
    per_target = tuple(nmae(data.targets[:, t], pred[:, t]) for t in range(data.targets.shape[1]))
    return SubsetScore(tuple(names[c] for c in columns), float(np.mean(per_target)), per_target)


def fold_systems(data: SelectionData) -> list[tuple[np.ndarray, _FoldSystem]]:
    x = proxy_matrix(data)
    return [(data.folds == f, _FoldSystem(x, data.targets, data.folds == f)) for f in np.unique(data.folds)]


def rank_subsets(
    data: SelectionData, signal_names: Sequence[str], sizes: Sequence[int], alpha: float
) -> list[SubsetScore]:
    """Every subset of each size, best (lowest NMAE) first; ties by size then names, so it is stable."""
    systems = fold_systems(data)
    scores = [
        score_subset(data, systems, cols, signal_names, alpha)
        for size in sorted(set(sizes))
        for cols in itertools.combinations(range(len(signal_names)), size)
    ]
    return sorted(scores, key=lambda s: (s.nmae, len(s.signals), s.signals))


def choose(ranking: Sequence[SubsetScore], size: int) -> SubsetScore:
    """The best subset of the given size; its signals keep the candidates' canonical order."""
    for score in ranking:
        if len(score.signals) == size:
            return score
    raise ValueError(f"no subset of size {size} was evaluated")


def restrict_rows(data: SelectionData, rows: np.ndarray) -> SelectionData:
    """The sample rows ``rows`` (boolean mask or indices) of every array."""
    return SelectionData(
        data.base[rows], data.signals[rows], data.is_invoke[rows], data.targets[rows], data.folds[rows]
    )


def with_folds(data: SelectionData, folds: np.ndarray) -> SelectionData:
    return replace(data, folds=np.asarray(folds, dtype=np.int64))


@dataclass(frozen=True)
class NestedSelection:
    by_fold: tuple[SubsetScore, ...]  # per outer fold (index = fold id): chosen on the other folds
    outer: SubsetScore  # pooled outer OOF NMAE of the procedure (signals: those of no single fold)


def nested_choice(
    data: SelectionData, signal_names: Sequence[str], size: int, alpha: float
) -> NestedSelection:
    """Per outer fold, the best subset of ``size`` by inner grouped OOF NMAE on the other folds."""
    folds = np.unique(data.folds)
    if not np.array_equal(folds, np.arange(len(folds))):
        raise ValueError(f"fold ids must be 0..k-1, got {folds.tolist()}")
    if len(folds) < 3:
        raise ValueError("nested selection needs at least 3 folds (2 inner folds per outer fold)")
    chosen = tuple(
        choose(rank_subsets(restrict_rows(data, data.folds != f), signal_names, [size], alpha), size)
        for f in folds
    )
    pred = np.empty_like(data.targets)
    for (test, system), pick in zip(fold_systems(data), chosen, strict=True):
        cols = [signal_names.index(n) for n in pick.signals]
        pred[test] = system.predict(proxy_columns(data, cols), alpha)
    per_target = tuple(nmae(data.targets[:, t], pred[:, t]) for t in range(data.targets.shape[1]))
    return NestedSelection(chosen, SubsetScore((), float(np.mean(per_target)), per_target))
