"""Lightning only wraps training: plain nn.Modules in, trained nn.Modules out, on CPU, seeded.

Contract: :func:`fit_regressor` seeds everything (``seed_everything`` + ``deterministic=True``,
one torch thread: small MLPs run fastest that way and results do not depend on the core count),
builds the module from a factory *after* seeding, and minimises masked MSE on standardized
targets (NaN targets are masked out, which is how the value system trains only the heads of the
branch each row took). Per-epoch train/validation losses are returned as a curve and, when an
MLflow logger is given, logged through it under ``prefix``. :func:`fit_weighted` is the same
recipe for one-output modules with per-row weights (weighted MSE or weighted logistic loss) in a
plain torch loop, for the student's many cross-fits.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from config.params import TrainConfig


@dataclass(frozen=True)
class Standardizer:
    """Column-wise (x - mean) / std with training-set stats; constant columns get std 1."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardizer:
        x = np.asarray(x, dtype=np.float64)
        mean, std = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
        return cls(mean, np.where(std > 1e-12, std, 1.0))

    def apply(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std

    def invert(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, dtype=np.float64) * self.std + self.mean


@dataclass
class Curve:
    epochs: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class FitResult:
    module: nn.Module
    curve: Curve


def _masked_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    mask = torch.isfinite(y)
    diff = torch.where(mask, pred - torch.nan_to_num(y), torch.zeros_like(pred))
    return diff.pow(2).sum() / mask.sum().clamp(min=1)


class _Task(L.LightningModule):
    def __init__(self, module: nn.Module, cfg: TrainConfig, prefix: str) -> None:
        super().__init__()
        self.module, self.cfg, self.prefix = module, cfg, prefix

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], name: str) -> torch.Tensor:
        x, y = batch
        loss = _masked_mse(self.module(x), y)
        self.log(f"{self.prefix}{name}_loss", loss, on_step=False, on_epoch=True, batch_size=len(x))
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        return self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.module.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)


class _CurveRecorder(L.Callback):
    def __init__(self, prefix: str) -> None:
        self.prefix, self.curve = prefix, Curve()

    def on_train_epoch_end(self, trainer: L.Trainer, _: L.LightningModule) -> None:
        m = trainer.callback_metrics
        self.curve.epochs.append(trainer.current_epoch)
        self.curve.train_loss.append(float(m[f"{self.prefix}train_loss"]))
        val = m.get(f"{self.prefix}val_loss")
        self.curve.val_loss.append(float(val) if val is not None else float("nan"))


def quiet_lightning() -> None:
    """Silence Lightning's banner lines, tips and the small-dataset warnings (expected here)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def _loader(x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool) -> DataLoader:
    data = TensorDataset(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32))
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle)


def fit_regressor(
    make_module: Callable[[], nn.Module],
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainConfig,
    val: tuple[np.ndarray, np.ndarray] | None = None,
    logger: object | None = None,
    prefix: str = "",
) -> FitResult:
    """Train a fresh module on standardized (x, y (n, heads)); see the module contract."""
    quiet_lightning()
    torch.set_num_threads(1)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = make_module()
    recorder = _CurveRecorder(prefix)
    trainer = L.Trainer(
        max_epochs=cfg.epochs,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        logger=logger if logger is not None else False,
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    val_loader = _loader(*val, batch_size=4096, shuffle=False) if val is not None else None
    trainer.fit(_Task(module, cfg, prefix), _loader(x, y, cfg.batch_size, True), val_loader)
    return FitResult(module.eval(), recorder.curve)


@torch.no_grad()
def predict(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """Module outputs for float64 inputs, as float64 NumPy (n, heads)."""
    return module(torch.as_tensor(x, dtype=torch.float32)).double().numpy()


def fit_weighted(
    make_module: Callable[[], nn.Module],
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    cfg: TrainConfig,
    logistic: bool = False,
) -> FitResult:
    """Weighted MSE (or weighted logistic loss on 0/1 targets) of a one-output module, plain torch.

    Seeded and single-threaded like :func:`fit_regressor` (same AdamW, minibatches, epochs), but
    without Lightning: the student is cross-fitted dozens of times per run (nested thresholds,
    two splits, baselines) and Lightning's per-step overhead made each fit ~4x slower.
    """
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    module = make_module()
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(np.asarray(y).reshape(-1, 1), dtype=torch.float32)
    wt = torch.as_tensor(np.asarray(w).reshape(-1, 1), dtype=torch.float32)
    opt = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    curve = Curve()
    module.train()
    for epoch in range(cfg.epochs):
        total = 0.0
        for idx in torch.randperm(len(xt), generator=gen).split(cfg.batch_size):
            out = module(xt[idx])
            if logistic:
                per_row = nn.functional.binary_cross_entropy_with_logits(out, yt[idx], reduction="none")
            else:
                per_row = (out - yt[idx]).pow(2)
            loss = (wt[idx] * per_row).sum() / wt[idx].sum().clamp(min=1e-12)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        curve.epochs.append(epoch)
        curve.train_loss.append(total / len(xt))
        curve.val_loss.append(float("nan"))
    return FitResult(module.eval(), curve)
