"""Training settings of the learning stages' MLPs (torch-free, so params.py can use the type)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    """Minibatch training settings of a small regressor (see models.training.fit_regressor)."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    seed: int
