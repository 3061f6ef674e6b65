"""Plain MLP building blocks shared by the value system and the student (no Lightning here).

Export naming: a head's Linear layers become ``{head}.{i}.weight`` (out, in) and ``{head}.{i}.bias``
for i = 0, 1, ...; ReLU sits between consecutive layers, none after the last. decoder/deploy/scheduler.py
reads exactly this layout with NumPy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (none after the output)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp_param_count(sizes: Sequence[int]) -> int:
    """Weights plus biases of :func:`mlp` (sizes), by formula."""
    return sum(a * b + b for a, b in itertools.pairwise(sizes))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def mlp_arrays(head: str, seq: nn.Sequential) -> dict[str, np.ndarray]:
    """The export-layout arrays (float32) of one head's Linear layers, in order."""
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    out = {}
    for i, lin in enumerate(linears):
        out[f"{head}.{i}.weight"] = lin.weight.detach().cpu().numpy().astype(np.float32)
        out[f"{head}.{i}.bias"] = lin.bias.detach().cpu().numpy().astype(np.float32)
    return out


def load_mlp_arrays(head: str, seq: nn.Sequential, arrays: dict[str, np.ndarray]) -> None:
    """Inverse of :func:`mlp_arrays`: copy exported arrays into a module of the same shape."""
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(torch.from_numpy(arrays[f"{head}.{i}.weight"]))
            lin.bias.copy_(torch.from_numpy(arrays[f"{head}.{i}.bias"]))
