"""Cross-fitting the student: out-of-fold scores, each fold's threshold chosen inside its training part.

Contract of :func:`cross_fit`: for outer fold f, the model that scores fold f's states trains only
on the other folds, with fold f's own inputs and targets (``FoldInputs``: e.g. the signal subset
and the value-system margins that were chosen/fitted without fold f). With ``nested_threshold``,
fold f's threshold comes from inner out-of-fold scores on its training part (each other fold g
scored by a model trained without f and g) and the training states' realised regrets through
models.offline.choose_threshold; otherwise the threshold is 0 (the paper's rule). Nothing of fold
f is used for its scores or its threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from config.params import TrainConfig
from models.offline import choose_threshold
from models.student import Student, objective
from models.training import Curve, Standardizer, fit_weighted, predict


@dataclass(frozen=True)
class StudentSpec:
    loss: str  # models.student.LOSSES
    hidden: tuple[int, ...]
    train: TrainConfig
    tolerance_pct: float  # threshold choice: largest t within this many points of the best
    nested_threshold: bool  # False: threshold 0


@dataclass(frozen=True)
class FittedStudent:
    module: Student
    x_std: Standardizer
    y_std: Standardizer  # identity for the logistic loss (the output is a logit)
    curve: Curve

    def score(self, z: np.ndarray) -> np.ndarray:
        """Decision score per row in margin units (de-standardized), or logits."""
        return self.y_std.invert(predict(self.module, self.x_std.apply(z)))[:, 0]


def fit_student(z: np.ndarray, margin: np.ndarray, rows: np.ndarray, spec: StudentSpec) -> FittedStudent:
    """A fresh student on states ``rows`` (standardization from them)."""
    obj = objective(margin[rows], spec.loss)
    xs = Standardizer.fit(z[rows])
    ys = Standardizer(np.zeros(1), np.ones(1)) if obj.is_logistic else Standardizer.fit(obj.target[:, None])
    res = fit_weighted(
        lambda: Student(z.shape[1], spec.hidden),
        xs.apply(z[rows]),
        ys.apply(obj.target[:, None]),
        obj.weight,
        spec.train,
        logistic=obj.is_logistic,
    )
    return FittedStudent(res.module, xs, ys, res.curve)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FoldInputs:
    z: np.ndarray  # (n_states, d): inputs of this outer fold's models
    margin: np.ndarray  # (n_states,): training targets of this outer fold's models


@dataclass(frozen=True)
class CrossFit:
    scores: np.ndarray  # (n_states,) out-of-fold scores
    thresholds: tuple[float, ...]  # per outer fold
    decisions: np.ndarray  # (n_states,) score > its fold's threshold
    curves: dict[str, Curve]  # outer fits, "fold<f>"


def _inner_threshold(
    inputs: FoldInputs, folds: np.ndarray, train: np.ndarray, regret: np.ndarray, spec: StudentSpec
) -> float:
    inner = np.full(len(folds), np.nan)
    for g in np.unique(folds[train]):
        held = folds == g
        inner[held] = fit_student(inputs.z, inputs.margin, train & ~held, spec).score(inputs.z[held])
    return choose_threshold(inner[train], regret[train], spec.tolerance_pct)


def cross_fit(
    inputs: Sequence[FoldInputs], folds: np.ndarray, regret: np.ndarray, spec: StudentSpec
) -> CrossFit:
    """Out-of-fold scores and decisions over ``folds`` (ids 0..k-1); see the module contract.

    ``regret``: per state, the realised margin / the state's best tok/s (for the thresholds).
    """
    k = int(folds.max()) + 1
    if len(inputs) != k:
        raise ValueError(f"{len(inputs)} fold inputs for {k} folds")
    scores, decisions = np.empty(len(folds)), np.zeros(len(folds), dtype=bool)
    thresholds, curves = [], {}
    for f, inp in enumerate(inputs):
        test = folds == f
        model = fit_student(inp.z, inp.margin, ~test, spec)
        scores[test] = model.score(inp.z[test])
        t = _inner_threshold(inp, folds, ~test, regret, spec) if spec.nested_threshold else 0.0
        decisions[test] = scores[test] > t
        thresholds.append(t)
        curves[f"fold{f}"] = model.curve
    return CrossFit(scores, tuple(thresholds), decisions, curves)
