"""DVC stage ``distill``: the student MLP on z alone regresses the standardized margin; offline table.

Targets: ``distill.margin_source`` value (the paper: value-system margins) or oracle; with
``distill.relative`` the margin is divided by the state's best realised tokens/s (a positive
per-state scale, so signs are kept and fast and slow reports weigh alike). Out of fold, the student
for held-out fold f trains on the other folds' states with margins from the value model that did
not see fold f either, so nothing of fold f leaks. Offline evaluation follows a policy from the
empty prefix (invoke iff margin > 0) and reads the reached schedule's realised tokens/s from
``trajectories.parquet``; compared with the best enumerated schedule, All-Small, All-Mid, 10101
and the value planner. Writes ``distill.out_dir/`` student.{json,safetensors}, offline.csv,
offline.md, curves.csv and metrics.json.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa

from collectors.plots import new_figure
from config.params import Params, resolve
from decoder.scheduler import build_manifest, write_artifact
from decoder.state import state_feature_names
from features.collect_schemas import TRAJECTORIES
from features.datasets import column, state_matrix
from features.schemas import margins_spec, states_spec
from features.tables import read_table
from models.mlp import count_parameters, mlp_arrays
from models.offline import PolicyResult, evaluate, summary
from models.student import HEAD, Student, student_param_count
from models.training import Curve, FitResult, Standardizer, fit_regressor, predict
from pipeline.cli import run_stage
from pipeline.select_signals import read_signals
from pipeline.tracking import (
    file_sha256,
    git_revision,
    lightning_logger,
    log_figure,
    log_metrics,
    stage_run,
    write_csv,
    write_json,
)

log = logging.getLogger(__name__)
POLICIES = ("best", "student_oof", "student", "value_planner_oof", "all_small", "all_mid", "fixed_10101")


@dataclass(frozen=True)
class Targets:
    final: np.ndarray  # margin per state for the all-reports student
    by_fold: np.ndarray  # (n_states, n_folds): margin from the value model without fold f
    oracle: np.ndarray  # realised margin (same units), for sign accuracy


def targets(margins: pa.Table, source: str, relative: bool) -> Targets:
    if source not in ("value", "oracle"):
        raise ValueError(f"distill.margin_source must be 'value' or 'oracle', got {source!r}")
    oracle = column(margins, "margin_oracle_tok_per_s").astype(float)
    by_fold = np.array(margins.column("margin_value_by_fold_tok_per_s").to_pylist(), dtype=float)
    if source == "value":
        final = column(margins, "margin_value_tok_per_s").astype(float)
    else:
        final, by_fold = oracle, np.repeat(oracle[:, None], by_fold.shape[1], axis=1)
    scale = (
        np.maximum(column(margins, "oracle_invoke_tok_per_s"), column(margins, "oracle_skip_tok_per_s"))
        if relative
        else np.ones(len(final))
    )
    return Targets(final / scale, by_fold / scale[:, None], oracle / scale)


def _fit(
    z: np.ndarray, y: np.ndarray, rows: np.ndarray, params: Params, prefix: str, logger: object
) -> tuple[FitResult, Callable[[np.ndarray], np.ndarray], Standardizer, Standardizer]:
    cfg = params.distill
    xs, ys = Standardizer.fit(z[rows]), Standardizer.fit(y[rows, None])
    res = fit_regressor(
        lambda: Student(z.shape[1], cfg.hidden),
        xs.apply(z[rows]),
        ys.apply(y[rows, None]),
        cfg.train,
        logger=logger,
        prefix=prefix,
    )
    return res, lambda q: ys.invert(predict(res.module, xs.apply(q)))[:, 0], xs, ys


@dataclass(frozen=True)
class StudentFits:
    final: FitResult  # trained on every state
    predict: Callable[[np.ndarray], np.ndarray]  # final student, margin units
    x_std: Standardizer
    y_std: Standardizer
    oof: np.ndarray  # per state, from the student that never saw its fold
    curves: dict[str, Curve]


def _train(z: np.ndarray, tg: Targets, folds: np.ndarray, params: Params, logger: object) -> StudentFits:
    """One student per held-out fold (its own fold's value margins), then the final one on all states."""
    oof, curves = np.empty(len(z)), {}
    for f in range(folds.max() + 1):
        test = folds == f
        fold_res, fold_pred, _, _ = _fit(z, tg.by_fold[:, f], ~test, params, f"fold{f}/", logger)
        oof[test] = fold_pred(z[test])
        curves[f"fold{f}"] = fold_res.curve
    res, pred, xs, ys = _fit(z, tg.final, np.ones(len(z), dtype=bool), params, "final/", logger)
    curves["final"] = res.curve
    n_params = count_parameters(res.module)
    if n_params != student_param_count(z.shape[1], params.distill.hidden):
        raise RuntimeError(
            f"student has {n_params} parameters, not {student_param_count(17, params.distill.hidden)}"
        )
    return StudentFits(res, pred, xs, ys, oof, curves)


def main(params: Params) -> dict:
    depth, cfg = params.tree.depth, params.distill
    out = resolve(cfg.out_dir)
    states = read_table(resolve(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(resolve(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    trajectories = read_table(resolve(params.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    signals = read_signals(params)
    names = state_feature_names(depth, signals)
    z = state_matrix(states, names)
    folds = column(states, "fold_id").astype(int)
    tg = targets(margins, cfg.margin_source, cfg.relative)
    with stage_run("distill", params) as run:
        fits = _train(z, tg, folds, params, lightning_logger(params, run))
        res, pred, oof = fits.final, fits.predict, fits.oof
        decisions = {
            "student_oof": oof > 0,
            "student": pred(z) > 0,
            "value_planner_oof": column(margins, "margin_value_oof_tok_per_s") > 0,
        }
        results = _offline(states, trajectories, decisions, depth)
        metrics = {
            "n_params": count_parameters(res.module),
            "n_states": len(z),
            "oof_margin_mae": float(np.mean(np.abs(oof - tg.final))),
            "oof_sign_accuracy_vs_target": float(np.mean((oof > 0) == (tg.final > 0))),
            "oof_sign_accuracy_vs_oracle": float(np.mean((oof > 0) == (tg.oracle > 0))),
            "offline": summary(results),
        }
        extra = {
            "signals": list(signals),
            "margin_source": cfg.margin_source,
            "margin_units": "relative (margin / best realised tok/s)" if cfg.relative else "tok_per_s",
            "decision": "invoke the mid drafter iff the de-standardized margin > 0",
            "training_data_sha256": file_sha256(resolve(params.collect.out_dir) / "actions.parquet"),
            "git_revision": git_revision(),
            "metrics": metrics,
        }
        _save(out, res.module, fits.x_std, fits.y_std, params, names, extra)
        table = _write_offline(out, results)
        write_csv(
            out / "curves.csv",
            [
                {"fit": fit, "epoch": e, "train_loss": t}
                for fit, c in fits.curves.items()
                for e, t in zip(c.epochs, c.train_loss, strict=True)
            ],
        )
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        mlflow.log_text(table, "offline.md")
        _plot(results, fits.curves)
    log.info("offline table:\n%s", table)
    return metrics


def _save(
    out: Path,
    module: Student,
    xs: Standardizer,
    ys: Standardizer,
    params: Params,
    names: Sequence[str],
    extra: dict,
) -> None:
    manifest = build_manifest(
        kind="student",
        depth=params.tree.depth,
        width=params.tree.width,
        feature_names=names,
        input_names=names,
        x_mean=xs.mean,
        x_std=xs.std,
        heads={HEAD: module.sizes},
        y_mean={HEAD: float(ys.mean[0])},
        y_std={HEAD: float(ys.std[0])},
        **extra,
    )
    write_artifact(out / "student", manifest, mlp_arrays(HEAD, module.net))


def _offline(states: pa.Table, trajectories: pa.Table, decisions: dict, depth: int) -> dict:
    index = {
        (r, int(k), p): i
        for i, (r, k, p) in enumerate(
            zip(column(states, "report_id"), column(states, "step"), column(states, "prefix"), strict=True)
        )
    }
    tp = trajectories.select(["report_id", "schedule", "throughput_tok_per_s"]).to_pydict()
    throughput = {(r, s): t for r, s, t in zip(*tp.values(), strict=True)}
    fixed = {"all_small": "0" * depth, "all_mid": "1" * depth, "fixed_10101": ("10" * depth)[:depth]}
    reports = sorted(set(column(states, "report_id")))
    return evaluate(decisions, fixed, index, throughput, reports, depth)


def _write_offline(out: Path, results: dict[str, dict[str, PolicyResult]]) -> str:
    rows = []
    for report, row in results.items():
        rows.append({"report_id": report, **{p: row[p].tok_per_s for p in POLICIES}})
    write_csv(out / "offline.csv", rows)
    head = "| report | " + " | ".join(POLICIES) + " |"
    lines = [head, "|" + "---|" * (len(POLICIES) + 1)]
    for report, row in results.items():
        cells = [f"{row[p].tok_per_s:.2f} ({row[p].schedule})" for p in POLICIES]
        lines.append(f"| {report} | " + " | ".join(cells) + " |")
    summ = summary(results)
    lines.append("| mean tok/s | " + " | ".join(f"{summ[p]['mean_tok_per_s']:.2f}" for p in POLICIES) + " |")
    lines.append(
        "| % of best (mean of ratios) | "
        + " | ".join(f"{summ[p]['mean_pct_of_best']:.1f}%" for p in POLICIES)
        + " |"
    )
    text = (
        "\n".join(lines) + "\n\nCells: realised tok/s (reached schedule, step 1 first). student_oof and "
        "value_planner_oof decide each report with models that never saw it.\n"
    )
    (out / "offline.md").write_text(text)
    return text


def _plot(results: dict, curves: dict) -> None:
    fig, ax = new_figure(8, 4)
    reports = list(results)
    width = 0.8 / (len(POLICIES) - 1)
    for j, p in enumerate(POLICIES[1:]):
        pct = [100 * results[r][p].tok_per_s / results[r]["best"].tok_per_s for r in reports]
        ax.bar(np.arange(len(reports)) + j * width, pct, width, label=p)
    ax.set_ylabel("% of best enumerated schedule")
    ax.set_xticks(np.arange(len(reports)) + 0.4, reports, rotation=90, fontsize=6)
    ax.set_ylim(bottom=min(50, ax.get_ylim()[0]))
    ax.legend(fontsize=6, ncol=3)
    log_figure(fig, "offline_pct_of_best.png")
    fig, ax = new_figure()
    for fit, c in curves.items():
        ax.plot(c.epochs, c.train_loss, lw=1, label=fit)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE (standardized margin)")
    ax.legend(fontsize=6)
    log_figure(fig, "learning_curves.png")


if __name__ == "__main__":
    run_stage("distill", main)
