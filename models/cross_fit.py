"""Cross-fitting the student: out-of-fold scores, each fold's threshold chosen inside its training part.

Contract of :func:`cross_fit`: for outer fold f, the model that scores fold f's states trains only
on the other folds, with fold f's own inputs and targets (``FoldInputs``: e.g. the signal subset
and the value-system margins that were chosen/fitted without fold f). The scored (evaluation)
states are the canonical ones; the training rows are those states or, with ``FoldInputs.train``,
other rows with their own fold ids (round-level states, or both sets stacked). With
``nested_threshold``, fold f's threshold comes from inner out-of-fold scores on its training part
(each other fold g scored by a model trained without f and g) through ``choose(scores, train,
models)`` (e.g. models.offline.choose_threshold_walked on the training reports; ``models``, the
inner models by g, let a rule score other rows of fold g, as models.thresholds.round_chooser
does); otherwise the threshold is 0 (the paper's rule). Nothing of fold f is used for its scores
or its threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from collectors.collect.pool import Task, WorkerPool
from config.params import TrainConfig
from models.student import Student, objective
from models.training import Curve, Standardizer, fit_weighted, predict


@dataclass(frozen=True)
class StudentSpec:
    loss: str  # models.student.LOSSES
    hidden: tuple[int, ...]
    train: TrainConfig
    tolerance_pct: float  # threshold choice: largest t within this many points of the best
    nested_threshold: bool  # False: threshold 0


def scaled_epochs(spec: StudentSpec, n_rows: int, reference_rows: int) -> StudentSpec:
    """``spec`` with epochs scaled so a training set of ``n_rows`` rows gets the optimizer steps that
    ``reference_rows`` rows get with ``train.epochs`` (at least one epoch): the large round-level
    set costs what the canonical one does."""
    epochs = max(1, round(spec.train.epochs * reference_rows / max(n_rows, 1)))
    return replace(spec, train=spec.train.model_copy(update={"epochs": epochs}))


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
class TrainRows:
    z: np.ndarray  # (n_rows, d)
    margin: np.ndarray  # (n_rows,)
    folds: np.ndarray  # (n_rows,) outer fold ids, the same grouping as the scored states'


@dataclass(frozen=True)
class FoldInputs:
    z: np.ndarray  # (n_states, d): inputs of this outer fold's models on the scored states
    margin: np.ndarray  # (n_states,): training targets on the scored states
    train: TrainRows | None = None  # other training rows; None: train on the scored states

    def rows(self, folds: np.ndarray) -> TrainRows:
        return self.train if self.train is not None else TrainRows(self.z, self.margin, folds)


@dataclass(frozen=True)
class CrossFit:
    scores: np.ndarray  # (n_states,) out-of-fold scores
    thresholds: tuple[float, ...]  # per outer fold
    decisions: np.ndarray  # (n_states,) score > its fold's threshold
    curves: dict[str, Curve]  # outer fits, "fold<f>"
    models: tuple[FittedStudent, ...] = ()  # outer fits by fold (to score other rows of fold f)


# (inner scores on the scored states, training-state mask, the inner models by fold g: each trained
# without the outer fold and g, to score other rows of fold g) -> t
Chooser = Callable[[np.ndarray, np.ndarray, Mapping[int, FittedStudent]], float]


# fit_student's arguments: (z, margin, the rows to train on, spec)
FitJob = tuple[np.ndarray, np.ndarray, np.ndarray, StudentSpec]
# Fits a batch of jobs, results in job order, each exactly what fit_student gives (seeded,
# single-threaded): in this process (fit_serially) or in worker processes (pool_fitter).
Fitter = Callable[[Sequence[FitJob]], list[FittedStudent]]


def fit_serially(jobs: Sequence[FitJob]) -> list[FittedStudent]:
    return [fit_student(*job) for job in jobs]


def _job_without(inputs: FoldInputs, folds: np.ndarray, held: Sequence[int], spec: StudentSpec) -> FitJob:
    """The fit of a student on the training rows whose fold is not in ``held`` (fold ids)."""
    rows = inputs.rows(folds)
    return rows.z, rows.margin, ~np.isin(rows.folds, np.asarray(held)), spec


def cross_fit(
    inputs: Sequence[FoldInputs],
    folds: np.ndarray,
    choose: Chooser | None,
    spec: StudentSpec,
    fit_all: Fitter = fit_serially,
) -> CrossFit:
    """Out-of-fold scores and decisions over ``folds`` (ids 0..k-1); see the module contract.

    ``choose``: the threshold rule on inner out-of-fold scores (needed with ``nested_threshold``).
    ``fit_all``: how the fits run; every fit (outer and inner) is independent of the others, so they
    go to it as one batch, and the result does not depend on where they ran.
    """
    k = int(folds.max()) + 1
    if len(inputs) != k:
        raise ValueError(f"{len(inputs)} fold inputs for {k} folds")
    nested = spec.nested_threshold
    if nested and choose is None:
        raise ValueError("a nested threshold needs a threshold rule (choose)")
    # per outer fold f: the fold ids g of its inner fits (each trained without f and g)
    inner_folds = [[int(g) for g in np.unique(folds[folds != f])] if nested else [] for f in range(k)]
    jobs = []
    for f, inp in enumerate(inputs):
        jobs.append(_job_without(inp, folds, [f], spec))
        jobs += [_job_without(inp, folds, [f, g], spec) for g in inner_folds[f]]
    fitted = iter(fit_all(jobs))
    scores, decisions = np.empty(len(folds)), np.zeros(len(folds), dtype=bool)
    thresholds, curves, models = [], {}, []
    for f, inp in enumerate(inputs):
        test = folds == f
        model = next(fitted)
        scores[test] = model.score(inp.z[test])
        inner_models = {g: next(fitted) for g in inner_folds[f]}
        if nested:
            assert choose is not None
            inner = np.full(len(folds), np.nan)
            for g, m in inner_models.items():
                held = folds == g
                inner[held] = m.score(inp.z[held])
            t = choose(inner, folds != f, inner_models)
        else:
            t = 0.0
        decisions[test] = scores[test] > t
        thresholds.append(t)
        curves[f"fold{f}"] = model.curve
        models.append(model)
    return CrossFit(scores, tuple(thresholds), decisions, curves, tuple(models))


def pool_fitter(pool: WorkerPool) -> Fitter:
    """A Fitter that hands a batch of fits to ``pool``'s worker processes."""

    def fit_all(jobs: Sequence[FitJob]) -> list[FittedStudent]:
        n = len(jobs)
        return pool.run(fit_student, [Task(f"student fit {i + 1} of {n}", job) for i, job in enumerate(jobs)])

    return fit_all
