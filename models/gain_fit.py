"""Fit GRAFT's per-node acceptance model: L2-regularised logistic regression by Newton's method.

The rows are DDTree nodes of replayed rounds (collectors/graft/walk.py, BudgetWalker.node_rows):
features decoder/graft/budget.NODE_FEATURES, label 1 when the node is on the target's path. The
fitted (weights, bias) give P(node accepted) = sigmoid(weights . x + bias), from which the rule of
decoder/graft/budget.py derives each round's whole gain curve. Features are standardised for the
solve and the coefficients mapped back, so the penalty ``l2`` (on standardised weights, not the
bias) does not depend on feature scales. Deterministic: no sampling, no seed. One class only
(no node ever, or always, accepted) has no finite fit: it gets zero weights and the smoothed
constant rate (Jeffreys' (k + 1/2) / (n + 1)) as bias.
"""

from __future__ import annotations

import numpy as np


def fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-3, max_iter: int = 100, tol: float = 1e-10
) -> tuple[np.ndarray, float]:
    """(weights, bias) minimising mean log-loss + l2/2 |w_std|^2 (module docstring)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 2 or y.shape != (len(x),) or len(x) == 0:
        raise ValueError(f"need features (n, f) and labels (n,), got {x.shape} and {y.shape}")
    if not np.all(np.isfinite(x)) or not np.all((y == 0) | (y == 1)):
        raise ValueError("features must be finite and labels 0 or 1")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    if y.min() == y.max():
        # One class (a drafter that never, or always, lands: tiny smoke models): the likelihood
        # has no finite optimum, so the rule falls back to the smoothed constant rate (k + 1/2)/(n + 1).
        k = float(y.sum())
        return np.zeros(x.shape[1]), float(np.log((k + 0.5) / (len(y) - k + 0.5)))
    mu, sd = x.mean(0), x.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    n, f = z.shape
    beta = np.zeros(f)
    beta[-1] = np.log(y.mean() / (1 - y.mean()))
    penalty = np.full(f, l2)
    penalty[-1] = 0.0
    for _ in range(max_iter):
        p = np.exp(-np.logaddexp(0.0, -(z @ beta)))
        grad = z.T @ (p - y) / n + penalty * beta
        hess = (z * (p * (1 - p))[:, None]).T @ z / n + np.diag(penalty) + 1e-12 * np.eye(f)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.max(np.abs(step)) < tol:
            break
    weights = beta[:-1] / sd
    bias = float(beta[-1] - np.dot(weights, mu))
    return weights, bias


def log_loss(x: np.ndarray, y: np.ndarray, weights: np.ndarray, bias: float) -> float:
    """Mean log-loss of (weights, bias) on (x, y)."""
    z = np.asarray(x, dtype=float) @ np.asarray(weights, dtype=float) + bias
    y = np.asarray(y, dtype=float)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))
