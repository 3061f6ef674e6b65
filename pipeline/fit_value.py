"""DVC stage ``fit_value``: the 4-head value system on [state z, suffix encoding], 5-fold grouped OOF.

Reads the canonicalize tables and the chosen signals; trains one model per fold (on the other
folds) for out-of-fold metrics per head, then the final model on all reports, the six fits in
``fit_value.workers`` processes (the same models as in one). Writes
``fit_value.out_dir/`` value.{json,safetensors} (decoder/deploy/scheduler.py format), folds/fold<f>.*
(used by the margins stage for leakage-free OOF margins), curves.csv and metrics.json.
One MLflow run ``fit_value``, with each fit's learning curve (``<fit>/train_loss`` and ``val_loss``
by epoch).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import mlflow
import numpy as np

from collectors.collect.pool import Task, WorkerPool
from collectors.evaluation.plots import new_figure
from config.params import FitValueParams, Params, resolve
from decoder.core.state import state_feature_names
from decoder.deploy.planning import HEADS, predicted_throughput, suffix_feature_names
from decoder.deploy.scheduler import build_manifest, write_artifact
from decoder.io.files import sha256_of_file
from features.datasets import ValueData, value_data
from features.schemas import samples_spec, states_spec
from features.selection import nmae
from features.signals_file import read_signals
from features.tables import read_table
from models.mlp import count_parameters, mlp_arrays
from models.training import Curve, FitResult, Standardizer, fit_regressor, predict
from models.value import ValueSystem, value_param_count
from pipeline.cli import run_stage
from pipeline.tracking import (
    git_revision,
    log_curves,
    log_figure,
    log_metrics,
    stage_run,
    write_csv,
    write_json,
)

log = logging.getLogger(__name__)


def _fit(
    data: ValueData, train: np.ndarray, cfg: FitValueParams, prefix: str, val: np.ndarray | None
) -> tuple[FitResult, Standardizer, Standardizer]:
    """Fit on rows `train` (standardization from them), validating on rows `val`: a pool task."""
    xs, ys = Standardizer.fit(data.x[train]), Standardizer.fit(data.y[train])
    val_xy = (xs.apply(data.x[val]), ys.apply(data.y[val])) if val is not None else None
    res = fit_regressor(
        lambda: ValueSystem(data.x.shape[1], cfg.hidden),
        xs.apply(data.x[train]),
        ys.apply(data.y[train]),
        cfg.train,
        val=val_xy,
        prefix=prefix,
    )
    return res, xs, ys


def _save(
    path: Path,
    res: FitResult,
    xs: Standardizer,
    ys: Standardizer,
    params: Params,
    names: Sequence[str],
    extra: dict,
) -> None:
    depth = params.tree.depth
    model: ValueSystem = res.module  # type: ignore[assignment]
    arrays = {k: v for h in HEADS for k, v in mlp_arrays(h, model.heads[h]).items()}
    manifest = build_manifest(
        kind="value",
        depth=depth,
        width=params.tree.width,
        feature_names=names,
        input_names=[*names, *suffix_feature_names(depth)],
        x_mean=xs.mean,
        x_std=xs.std,
        heads={h: model.sizes for h in HEADS},
        y_mean=dict(zip(HEADS, ys.mean, strict=True)),
        y_std=dict(zip(HEADS, ys.std, strict=True)),
        targets="A = mean accepted drafted tokens per round; logt = ln(round latency ms)",
        **extra,
    )
    write_artifact(path, manifest, arrays)


def _oof_metrics(data: ValueData, oof: np.ndarray) -> dict:
    metrics: dict = {}
    for j, head in enumerate(HEADS):
        rows = np.isfinite(data.y[:, j])
        metrics[f"oof_mae_{head}"] = float(np.mean(np.abs(oof[rows, j] - data.y[rows, j])))
        metrics[f"oof_nmae_{head}"] = nmae(data.y[rows, j], oof[rows, j])
    metrics["oof_nmae_mean"] = float(np.mean([metrics[f"oof_nmae_{h}"] for h in HEADS]))
    inv = data.is_invoke
    tput = np.where(
        inv, predicted_throughput(oof[:, 0], oof[:, 1]), predicted_throughput(oof[:, 2], oof[:, 3])
    )
    metrics["oof_nmae_throughput"] = nmae(data.throughput, tput)
    return metrics


def main(params: Params) -> dict:
    cfg, depth = params.fit_value, params.tree.depth
    src, out = resolve(params.canonicalize.out_dir), resolve(cfg.out_dir)
    signals = read_signals(params)
    names = state_feature_names(depth, signals)
    states = read_table(src / "states.parquet", states_spec(depth))
    data = value_data(states, read_table(src / "samples.parquet", samples_spec(depth)), depth, signals)
    extra = {
        "signals": list(signals),
        "training_data_sha256": sha256_of_file(resolve(params.collect.out_dir) / "actions.parquet"),
        "git_revision": git_revision(),
    }
    folds = [int(f) for f in np.unique(data.folds)]
    tasks = [Task(f"fold{f}", (data, data.folds != f, cfg, f"fold{f}/", data.folds == f)) for f in folds]
    tasks.append(Task("final", (data, np.ones(len(data.x), dtype=bool), cfg, "final/", None)))
    with stage_run("fit_value", params):
        with WorkerPool(min(cfg.workers, len(tasks)), 1, keep_freed=False) as pool:
            fitted = pool.run(_fit, tasks)
        oof, curves = np.full_like(data.y, np.nan), {}
        for f, (res, xs, ys) in zip(folds, fitted[:-1], strict=True):
            test = data.folds == f
            oof[test] = ys.invert(predict(res.module, xs.apply(data.x[test])))
            curves[f"fold{f}"] = res.curve
            _save(out / "folds" / f"fold{f}", res, xs, ys, params, names, extra)
        res, xs, ys = fitted[-1]
        curves["final"] = res.curve
        log_curves(curves)
        n_params = count_parameters(res.module)
        if n_params != value_param_count(data.x.shape[1], cfg.hidden):
            raise RuntimeError(
                f"value system has {n_params} parameters, not {value_param_count(23, cfg.hidden)}"
            )
        oof_metrics = _oof_metrics(data, oof)
        metrics = {"n_params": n_params, "n_samples": len(data.x), "n_inputs": data.x.shape[1], **oof_metrics}
        _save(out / "value", res, xs, ys, params, names, {**extra, "metrics": metrics})
        rows = [
            {"fit": fit, "epoch": e, "train_loss": t, "val_loss": v}
            for fit, c in curves.items()
            for e, t, v in zip(c.epochs, c.train_loss, c.val_loss, strict=True)
        ]
        write_csv(out / "curves.csv", rows)
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        mlflow.log_artifact(str(out / "value.json"))
        _plot(curves, data, oof)
    log.info("value system: %d params, OOF NMAE %.3f", n_params, metrics["oof_nmae_mean"])
    return metrics


def _plot(curves: dict[str, Curve], data: ValueData, oof: np.ndarray) -> None:
    fig, ax = new_figure()
    for fit, c in curves.items():
        ax.plot(c.epochs, c.train_loss, label=f"{fit} train", lw=1)
        if fit != "final":
            ax.plot(c.epochs, c.val_loss, ls="--", lw=1, label=f"{fit} val")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("masked MSE (standardized)")
    ax.legend(fontsize=6, ncol=2)
    log_figure(fig, "learning_curves.png")
    fig, _ = new_figure(8, 6)
    fig.clf()
    for j, head in enumerate(HEADS):
        ax = fig.add_subplot(2, 2, j + 1)
        rows = np.isfinite(data.y[:, j])
        ax.scatter(data.y[rows, j], oof[rows, j], s=3, alpha=0.5)
        lo, hi = np.nanmin(data.y[rows, j]), np.nanmax(data.y[rows, j])
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        ax.set_title(f"{head}: OOF prediction vs truth", fontsize=8)
    log_figure(fig, "oof_scatter.png")


if __name__ == "__main__":
    run_stage("fit_value", main)
