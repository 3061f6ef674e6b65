"""The value system: four separate MLPs on [state z, future-suffix encoding] (paper section 5.4).

Heads, in decoder.deploy.planning.HEADS order: accepted length and log round latency (ms) of the invoke
branch, then of the skip branch. Default 23 -> 128 -> 64 -> 1 each: 4 x 11,393 = 45,572 parameters
(the paper's count). Inputs and targets are standardized outside the module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from decoder.deploy.planning import HEADS
from models.mlp import mlp, mlp_param_count

PAPER_VALUE_PARAMS = 45_572


class ValueSystem(nn.Module):
    """x (n, in_dim) -> (n, 4) standardized predictions, one column per head."""

    def __init__(self, in_dim: int = 23, hidden: Sequence[int] = (128, 64)) -> None:
        super().__init__()
        self.sizes = (in_dim, *hidden, 1)
        self.heads = nn.ModuleDict({h: mlp(self.sizes) for h in HEADS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.heads[h](x) for h in HEADS], dim=1)


def value_param_count(in_dim: int = 23, hidden: Sequence[int] = (128, 64)) -> int:
    return len(HEADS) * mlp_param_count((in_dim, *hidden, 1))
