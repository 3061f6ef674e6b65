"""distill's computation, from the loaded tables to what the stage writes (no file I/O here).

:func:`distill` takes the canonical states, their margins, the trajectories, the round states
(None where ``distill.train_set`` is canonical) and select_signals' subsets; it fits every student
(models.student_selection.fit_students), chooses the exported student's round gates
(models.gate.round_policy), walks every policy offline (models.distill_metrics.offline) and returns
the exported student with its metrics, manifest fields, offline table, learning curves and figures.
:func:`student_export` is the exported student as a manifest and its arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from collectors.evaluation.plots import new_figure
from config.params import DistillParams
from decoder.core.state import state_feature_names
from decoder.deploy.scheduler import build_manifest
from features.datasets import column, state_matrix
from features.folds import fold_rows
from models.cross_fit import FittedStudent, Fitter, fit_serially
from models.distill_markdown import offline_markdown, offline_rows
from models.distill_metrics import LABELS, Results, distill_metrics, manifest_fields, offline
from models.gate import RoundPolicy, round_policy
from models.mlp import count_parameters, mlp_arrays
from models.round_walks import RoundSet
from models.student import HEAD, student_param_count
from models.student_selection import SignalSets, fit_students, replay_of, targets
from models.training import Curve


@dataclass(frozen=True)
class DistillInputs:
    """The tables distill reads, loaded."""

    states: pa.Table  # canonical states
    margins: pa.Table  # their margins (features.schemas.margins_spec)
    trajectories: pa.Table  # collect's trajectories (realised tokens/s per report and schedule)
    rounds: RoundSet | None  # round states; None where no training set needs them
    signals: SignalSets


@dataclass(frozen=True)
class Distilled:
    """What the stage writes."""

    student: FittedStudent  # the exported student
    feature_names: tuple[str, ...]  # its inputs
    metrics: dict  # metrics.json (the manifest carries it too)
    manifest_fields: dict  # its decision rule as the manifest states it
    offline_rows: list[dict]  # offline.csv
    table: str  # offline.md
    curve_rows: list[dict]  # curves.csv: fit, epoch, train_loss
    figures: dict[str, Any]  # file name -> matplotlib figure


def distill(
    cfg: DistillParams, depth: int, inputs: DistillInputs, fit_all: Fitter = fit_serially
) -> Distilled:
    """Every student, the exported one's gates and the offline evaluation (module docstring);
    ``fit_all``: where the student fits run (models.cross_fit.pool_fitter: in worker processes)."""
    states, margins, rs, signals = inputs.states, inputs.margins, inputs.rounds, inputs.signals
    names = state_feature_names(depth, signals.chosen)
    z = state_matrix(states, names)
    tg = targets(margins, cfg.margin_source, cfg.relative)
    replay = replay_of(states, inputs.trajectories)
    regret = targets(margins, "oracle", relative=True).oracle
    st = fit_students(cfg, depth, states, tg, regret, replay, rs, signals, fit_all)
    n_params = count_parameters(st.final.module)
    if n_params != student_param_count(z.shape[1], cfg.hidden):
        raise RuntimeError(
            f"student has {n_params} parameters, not {student_param_count(z.shape[1], cfg.hidden)}"
        )
    value_oof = column(margins, "margin_value_oof_tok_per_s")
    off = offline(st, value_oof, z, fold_rows(states, "report"), replay, pair_of(states), depth)
    oof = st.fits["student_oof"]
    policy = RoundPolicy() if rs is None else round_policy(oof, rs, depth, signals.by_report_fold)
    metrics = {
        "n_params": n_params,
        "n_states": len(z),
        **distill_metrics(cfg, st, tg, regret, off, rs, depth, policy),
    }
    curves = {f"{n}/{c}": v for n, f in st.fits.items() for c, v in f.curves.items()}
    curves["final"] = st.final.curve
    return Distilled(
        student=st.final,
        feature_names=names,
        metrics=metrics,
        manifest_fields=manifest_fields(cfg, st, policy, signals.chosen),
        offline_rows=offline_rows(off.results),
        table=offline_markdown(off.results, metrics["train_set"], metrics),
        curve_rows=[
            {"fit": fit, "epoch": e, "train_loss": t}
            for fit, c in curves.items()
            for e, t in zip(c.epochs, c.train_loss, strict=True)
        ],
        figures=figures(off.results, curves),
    )


def pair_of(states: pa.Table) -> dict[str, str]:
    """report id -> pair id."""
    reports, pairs = states.column("report_id").to_pylist(), states.column("pair_id").to_pylist()
    return dict(zip(reports, pairs, strict=True))


def student_export(
    student: FittedStudent, depth: int, width: int, names: tuple[str, ...], extra: dict
) -> tuple[dict, dict[str, np.ndarray]]:
    """The exported student's manifest (``extra``: the fields beside its shape and scaling) and arrays."""
    manifest = build_manifest(
        kind="student",
        depth=depth,
        width=width,
        feature_names=names,
        input_names=names,
        x_mean=student.x_std.mean,
        x_std=student.x_std.std,
        heads={HEAD: student.module.sizes},
        y_mean={HEAD: float(student.y_std.mean[0])},
        y_std={HEAD: float(student.y_std.std[0])},
        **extra,
    )
    return manifest, mlp_arrays(HEAD, student.module.net)


def figures(results: Results, curves: dict[str, Curve]) -> dict[str, Any]:
    """Each report's policies as % of its best schedule, and the exported fits' learning curves."""
    fig, ax = new_figure(8, 4)
    reports = list(results)
    policies = [p for p in LABELS if p in results[reports[0]] and p != "best"]
    width = 0.8 / len(policies)
    for j, p in enumerate(policies):
        pct = [100 * results[r][p].tok_per_s / results[r]["best"].tok_per_s for r in reports]
        ax.bar(np.arange(len(reports)) + j * width, pct, width, label=LABELS[p])
    ax.set_ylabel("% of best enumerated schedule")
    ax.set_xticks(np.arange(len(reports)) + 0.4, reports, rotation=90, fontsize=6)
    ax.set_ylim(bottom=min(50, ax.get_ylim()[0]))
    ax.legend(fontsize=6, ncol=3)
    out = {"offline_pct_of_best.png": fig}
    fig, ax = new_figure()
    for fit, c in curves.items():
        if fit == "final" or fit.startswith("student_oof/"):
            ax.plot(c.epochs, c.train_loss, lw=1, label=fit)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (weighted)")
    ax.legend(fontsize=6)
    out["learning_curves.png"] = fig
    return out
