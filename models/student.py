"""The student: a ReLU MLP from the state z alone (no future suffix) to the standardized margin.

Default 17 -> 64 -> 32 -> 1: 3,265 parameters (the paper's count). Online, invoke iff the
de-standardized prediction is > 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.mlp import mlp, mlp_param_count

PAPER_STUDENT_PARAMS = 3_265
HEAD = "margin"


class Student(nn.Module):
    """z (n, in_dim) -> (n, 1) standardized margin."""

    def __init__(self, in_dim: int = 17, hidden: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        self.sizes = (in_dim, *hidden, 1)
        self.net = mlp(self.sizes)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def student_param_count(in_dim: int = 17, hidden: Sequence[int] = (64, 32)) -> int:
    return mlp_param_count((in_dim, *hidden, 1))
