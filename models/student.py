"""The student: a ReLU MLP from the state z alone (no future suffix) to a decision score.

Default 17 -> 64 -> 32 -> 1: 3,265 parameters (the paper's count). Online, invoke iff the
de-standardized output is > the manifest's ``threshold`` (>= 0: when unsure, skip).

Objectives (:func:`objective`), all on the per-state margin m (invoke minus skip):
- ``mse``: regress standardized m, every state weighs alike (the paper; large |m| dominate).
- ``weighted_mse``: the same, each state weighted by |m| / mean |m| (a wrong sign costs |m|).
- ``weighted_logistic``: logistic loss on sign(m), weighted by |m| / mean |m|: a smooth surrogate
  of the regret |m| * [wrong decision], whose size the output no longer has to fit. The output is
  a logit (y_mean 0, y_std 1 in the manifest), thresholds are in logit units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.mlp import mlp, mlp_param_count

PAPER_STUDENT_PARAMS = 3_265
HEAD = "margin"
LOSSES = ("mse", "weighted_mse", "weighted_logistic")


class Student(nn.Module):
    """z (n, in_dim) -> (n, 1) standardized margin or logit."""

    def __init__(self, in_dim: int = 17, hidden: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        self.sizes = (in_dim, *hidden, 1)
        self.net = mlp(self.sizes)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def student_param_count(in_dim: int = 17, hidden: Sequence[int] = (64, 32)) -> int:
    return mlp_param_count((in_dim, *hidden, 1))


@dataclass(frozen=True)
class Objective:
    target: np.ndarray  # (n,) margin (regression) or 0/1 sign (logistic)
    weight: np.ndarray  # (n,) mean 1
    is_logistic: bool


def objective(margin: np.ndarray, loss: str) -> Objective:
    """Targets and per-state weights of ``loss`` (see the module docstring) for margins m."""
    if loss not in LOSSES:
        raise ValueError(f"student loss must be one of {LOSSES}, got {loss!r}")
    margin = np.asarray(margin, dtype=np.float64)
    if loss == "mse":
        return Objective(margin, np.ones(len(margin)), False)
    stake = np.abs(margin)
    weight = stake / stake.mean() if stake.mean() > 0 else np.ones(len(margin))
    if loss == "weighted_mse":
        return Objective(margin, weight, False)
    return Objective((margin > 0).astype(np.float64), weight, True)
