"""The six learning stages end to end on synthetic collectors' tables (real schemas), smoke profile.

Checks every output dvc.yaml declares for these stages, the metrics files, the parameter counts,
what the stages learn from a planted signal (chosen, and the student's signs beat chance), the
offline table and the exported decision against independent recomputations, and that each stage
left one MLflow run of its name with params, metrics and a plot (children of one pipeline run;
export's run holds the scheduler model).
"""

from __future__ import annotations

import csv
import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from dvc_outputs import declared_paths
from markdown_rows import md_rows
from safetensors.numpy import load_file
from synthetic_collect import write_synthetic_collect

from config.params import Params, deep_merge, load_params
from decoder.deploy.planning import suffix_feature_names
from decoder.deploy.scheduler import load_scheduler, load_value_planner
from features.collect_schemas import TRAJECTORIES
from features.datasets import state_matrix
from features.schemas import margins_spec, states_spec
from features.tables import read_table
from models.gate import Gate, backoff_key, parse_backoff_key
from pipeline.cli import stage_params

STAGES = ("canonicalize", "select_signals", "fit_value", "margins", "distill", "export")
PLANTED = "tree_size"  # carries the reports' hidden mid-drafter quality (tests/synthetic_collect.py)
N_REPORTS = 12


@pytest.fixture(scope="module")
def run_all(tmp_path_factory) -> tuple[Params, dict[str, dict]]:
    root = tmp_path_factory.mktemp("learning")
    write_synthetic_collect(root / "collect", n_reports=N_REPORTS, depth=5, seed=1, planted=PLANTED)
    overrides = {"collect": {"out_dir": str(root / "collect")}, "mlflow": {"db": str(root / "mlflow.db")}}
    overrides |= {s: {"out_dir": str(root / s)} for s in STAGES}
    # Enough training for the value system and student to learn the planted signal out of fold.
    overrides = deep_merge(overrides, {s: {"train": {"epochs": 30}} for s in ("fit_value", "distill")})
    params = load_params(profile="smoke", overrides=overrides)
    results = {s: importlib.import_module(f"pipeline.{s}").main(stage_params(s, params)) for s in STAGES}
    return params, results


def test_every_declared_output_exists(run_all):
    params, _ = run_all
    for stage, paths in declared_paths(params, STAGES).items():
        assert paths, stage
        for path in paths:
            assert path.exists(), f"{stage}: {path} declared in dvc.yaml was not written"
            if path.name == "metrics.json":
                assert json.loads(path.read_text())


def test_stage_results(run_all):
    params, res = run_all
    assert (
        res["canonicalize"]["n_states"] == N_REPORTS * 31 and res["canonicalize"]["states_per_report"] == 31
    )
    assert res["canonicalize"]["n_folds"] == 5
    assert res["select_signals"]["n_subsets_size_6"] == 210
    assert len(json.loads((Path(params.select_signals.out_dir) / "signals.json").read_text())["signals"]) == 6
    assert res["fit_value"]["n_params"] == 45_572
    assert res["margins"]["brute_force_max_abs_diff"] < 1e-9
    assert res["distill"]["n_params"] == 3_265
    offline = res["distill"]["offline"]
    assert all(0 < v["mean_pct_of_best"] <= 100.0 for v in offline.values())
    assert res["export"]["student_numpy_vs_torch_max_abs"] < 1e-4
    assert res["export"]["student_onnx_vs_numpy_max_abs"] < 1e-3
    depth = params.tree.depth
    states = read_table(Path(params.canonicalize.out_dir) / "states.parquet", states_spec(depth))
    margins = read_table(Path(params.margins.out_dir) / "margins.parquet", margins_spec(depth))
    assert margins.column("state_id").to_pylist() == states.column("state_id").to_pylist()
    assert np.all(np.isfinite(margins.column("margin_oracle_tok_per_s").to_numpy()))


def test_exported_artifacts_load_in_the_decoder(run_all):
    params, _ = run_all
    out = Path(params.export.out_dir)
    sched = load_scheduler(out / "scheduler.json", params.tree.depth, params.tree.width)
    planner = load_value_planner(out / "value_planner.json", params.tree.depth, params.tree.width)
    manifest = sched.manifest
    assert len(manifest["feature_names"]) == 17 and manifest["depth"] == 5
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["training_data_sha256"])
    assert manifest["git_revision"] and "offline" in manifest["metrics"]
    assert not set(manifest["input_names"]) & set(suffix_feature_names(5))  # the student sees no suffix
    assert np.isfinite(planner.margin(np.zeros(17), 1))


def _numpy_margin(manifest: dict, arrays: dict[str, np.ndarray], z: np.ndarray) -> np.ndarray:
    """The student's output written out from the raw weights: standardize, ReLU MLP, de-standardize."""
    (head,) = manifest["heads"]
    h = (z - np.array(manifest["x_mean"])) / np.array(manifest["x_std"])
    n_layers = len(manifest["heads"][head]) - 1
    for i in range(n_layers):
        w, b = arrays[f"{head}.{i}.weight"].astype(np.float64), arrays[f"{head}.{i}.bias"].astype(np.float64)
        h = h @ w.T + b
        if i < n_layers - 1:
            h = np.maximum(h, 0.0)
    return h[:, 0] * manifest["y_std"][head] + manifest["y_mean"][head]


def test_exported_decision_is_the_margin_of_the_raw_weights_above_the_threshold(run_all):
    params, _ = run_all
    out = Path(params.export.out_dir)
    manifest = json.loads((out / "scheduler.json").read_text())
    arrays = load_file(str(out / "scheduler.safetensors"))
    states = read_table(Path(params.canonicalize.out_dir) / "states.parquet", states_spec(params.tree.depth))
    z = state_matrix(states, manifest["feature_names"])
    rng = np.random.default_rng(0)
    z = np.concatenate([z, z + rng.normal(scale=z.std(axis=0) + 1e-3, size=z.shape)])
    margin = _numpy_margin(manifest, arrays, z)
    threshold = float(manifest.get("threshold", 0.0))
    sched = load_scheduler(out / "scheduler.json", params.tree.depth, params.tree.width)
    decided = np.array([sched.decide(row) for row in z])
    assert decided.any() and not decided.all()  # both decisions occur, so agreement means something
    np.testing.assert_array_equal(decided, margin > threshold)
    np.testing.assert_allclose([sched.margin(row) for row in z], margin, rtol=1e-6, atol=1e-9)


def test_signal_selection_finds_the_planted_signal(run_all):
    params, _ = run_all
    folder = Path(params.select_signals.out_dir)
    chosen = json.loads((folder / "signals.json").read_text())["signals"]
    assert PLANTED in chosen
    with (folder / "ranking.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["size"]) == params.select_signals.n_signals]
    with_planted = [float(r["nmae"]) for r in rows if PLANTED in r["signals"].split("+")]
    without = [float(r["nmae"]) for r in rows if PLANTED not in r["signals"].split("+")]
    assert with_planted and without and max(with_planted) < min(without)


def test_student_out_of_fold_decisions_beat_the_majority_guess(run_all):
    """Against the realised (oracle) signs, the OOF student beats always answering the commoner sign."""
    params, res = run_all
    margins = read_table(Path(params.margins.out_dir) / "margins.parquet", margins_spec(params.tree.depth))
    positive = np.mean(margins.column("margin_oracle_tok_per_s").to_numpy() > 0)
    chance = max(positive, 1 - positive)
    assert res["distill"]["oof_decision_accuracy_vs_oracle"] > chance


def test_offline_best_is_the_per_report_max_over_the_enumerated_schedules(run_all):
    """offline.csv recomputed from trajectories.parquet: best = max, every policy = one schedule's tok/s."""
    params, _ = run_all
    depth = params.tree.depth
    traj = read_table(Path(params.collect.out_dir) / "trajectories.parquet", TRAJECTORIES).to_pydict()
    by_report: dict[str, dict[str, float]] = {}
    for r, sched, t in zip(traj["report_id"], traj["schedule"], traj["throughput_tok_per_s"], strict=True):
        by_report.setdefault(r, {})[sched] = t
    assert all(len(v) == 2**depth for v in by_report.values())
    with (Path(params.distill.out_dir) / "offline.csv").open() as fh:
        rows = {r.pop("report_id"): {k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted(by_report)
    fixed = {"all_small": "0" * depth, "all_mid": "1" * depth, "fixed_10101": "10101"}
    for report, row in rows.items():
        enumerated = by_report[report]
        assert row["best"] == pytest.approx(max(enumerated.values()), rel=1e-12)
        for name, tput in row.items():
            assert any(tput == pytest.approx(t, rel=1e-12) for t in enumerated.values()), (report, name)
            assert tput <= row["best"] * (1 + 1e-12)
        for name, sched in fixed.items():
            assert row[name] == pytest.approx(enumerated[sched], rel=1e-12), (report, name)


def test_each_stage_is_one_mlflow_run_with_params_metrics_and_a_plot(run_all):
    from mlflow import MlflowClient

    from pipeline.tracking import tracking_uri

    params, _ = run_all
    client = MlflowClient(tracking_uri(params.mlflow))
    exp = client.get_experiment_by_name(params.mlflow.experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`pipeline.kind` = 'stage'", max_results=100)
    assert sorted(r.info.run_name for r in runs) == sorted(STAGES)
    # One process, no parent id passed down: the stages still form one pipeline run.
    (parent,) = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert client.get_run(parent).data.tags["pipeline.kind"] == "pipeline"
    (export,) = [r for r in runs if r.info.run_name == "export"]
    (model,) = client.search_logged_models([exp.experiment_id], f"source_run_id = '{export.info.run_id}'")
    assert model.name == "scheduler"
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params and run.data.metrics, run.info.run_name
        plots = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
        want = {"fit_value": "oof_nmae_A_invoke", "distill": "offline.student_oof.mean_pct_of_best"}
        assert want.get(run.info.run_name, next(iter(run.data.metrics))) in run.data.metrics
        assert any(p.endswith(".png") for p in plots), run.info.run_name


def test_distill_exports_the_training_states_that_won_out_of_fold(run_all):
    """Canonical, round-level and both: fitted on the same folds, compared by the walked offline
    metric; the exported student (its row, threshold and README-facing table) is the winner's."""
    params, res = run_all
    ts = res["distill"]["train_set"]
    pct = ts["oof_pct_of_best"]
    assert sorted(pct) == ["both", "canonical", "rounds"]
    assert ts["selected_by"] == "rounds"  # with round states loaded, the walk over round starts decides
    walks = ts["round_walk_pct_of_oracle"]
    merit = {n: walks[n] for n in pct}
    assert ts["best_walk"] == max(merit, key=merit.get)
    # the best walk is exported unless "both" walks within one standard error of it over the reports
    lead, se = ts["best_lead_over_both_pct"], ts["best_lead_over_both_se"]
    assert ts["winner"] == (ts["best_walk"] if lead > se else "both")
    assert ts["best_walk"] != "both" or (lead, se) == (0.0, 0.0)
    assert ts["n_round_states"] == N_REPORTS * 2 * 3 * 31  # synthetic: 2 prompts x 3 starts per report
    offline = res["distill"]["offline"]
    # distill.loss auto: the MSE student (threshold 0) only where it walks ahead of the thresholded
    # winner by more than one standard error over the reports
    assert ts["mse_lead_pct"] == pytest.approx(walks["mse"] - walks[ts["mse_lead_vs"]])
    mse_wins = ts["mse_lead_pct"] > ts["mse_lead_se"] >= 0
    assert mse_wins or ts["mse_lead_vs"] == ts["winner"]
    assert ts["exported_loss"] == ("mse" if mse_wins else "weighted_logistic")
    exported = "student_mse_oof" if mse_wins else f"student_{ts['winner']}_oof"
    assert offline["student_oof"]["mean_pct_of_best"] == offline[exported]["mean_pct_of_best"]
    for name in pct:
        if name != ts["winner"] or ts["exported_loss"] == "mse":
            assert offline[f"student_{name}_oof"]["mean_pct_of_best"] == pct[name]
    ranked = sorted(merit.values(), reverse=True)
    assert ts["margin_over_runner_up_pct"] == pytest.approx(ranked[0] - ranked[1])
    manifest = json.loads((Path(params.distill.out_dir) / "student.json").read_text())
    if ts["exported_loss"] == "mse":
        assert manifest["threshold"] == 0.0 and "(mse)" in manifest["decision"]
    else:
        assert manifest["threshold"] == pytest.approx(float(np.median(ts["fold_thresholds"][ts["winner"]])))
    assert all(0 < v <= 100 for v in ts["round_walk_pct_of_oracle"].values())
    table = (Path(params.distill.out_dir) / "offline.md").read_text()
    assert f"exported: **{ts['winner']}**" in table and any(r[0] == "rounds" for r in md_rows(table))
    # the lookahead's worth: the thresholded winner's set refitted with the lookahead set to 0
    blind = ts["lookahead_lead_vs"]
    assert blind == (ts["mse_lead_vs"] if mse_wins else ts["winner"])
    assert ts["lookahead_lead_pct"] == pytest.approx(walks[blind] - walks["no_lookahead"])
    assert ts["no_lookahead_oof_pct_of_best"] == offline["student_no_lookahead_oof"]["mean_pct_of_best"]
    assert any(r[0] == f"{blind} without the n-gram lookahead (set to 0)" for r in md_rows(table))


def test_distill_exports_the_gate_whose_decision_priced_walk_is_best(run_all):
    """skip_rest_below: the gate with the best decision-priced round walk unless deciding every
    step leads it by more than one standard error over the reports; in the manifest."""
    params, res = run_all
    metrics = res["distill"]
    walks = metrics["decision_priced_walk_pct"]
    students = {k: v for k, v in walks.items() if k.startswith("student_skip_rest_below_")}
    assert "student_skip_rest_below_none" in students and len(students) > 1 and "all_small" in walks
    none = students.pop("student_skip_rest_below_none")
    best_gate = max(students.values())
    noise = metrics["skip_rest_noise"]
    assert noise["none_lead"] == pytest.approx(none - best_gate)
    assert noise["none_lead_se"] >= 0 and noise["reports"] >= 2
    gate = Gate(metrics["skip_rest_below"], metrics["skip_rest_max_target_ms"])
    if noise["none_lead"] > noise["none_lead_se"]:
        assert gate == Gate()
    else:
        assert students[f"student_skip_rest_below_{gate.key}"] == best_gate
    manifest = json.loads((Path(params.distill.out_dir) / "student.json").read_text())
    assert manifest.get("skip_rest_below") == gate.below
    assert manifest.get("skip_rest_max_target_ms") == (gate.max_target_ms if gate.below is not None else None)
    assert "Decision-priced round walk" in (Path(params.distill.out_dir) / "offline.md").read_text()


def test_distill_exports_the_backoff_whose_walk_is_best(run_all):
    """skip_rounds_max c and skip_rounds_margin h: every candidate walked (after the chosen gate),
    the best exported, ties to the larger cap; c = 0 is the gate's own walk; the manifest and the
    decoder carry both."""
    params, res = run_all
    metrics = res["distill"]
    walks = metrics["decision_priced_walk_pct"]
    found = {ch: v for k, v in walks.items() if (ch := parse_backoff_key(k)) is not None}
    assert sorted({c for c, _ in found}) == [0, 1, 3, 7, 15]
    assert all((c, 0.0) in found for c in (0, 1, 3, 7, 15))  # h = 0 (idle = no mid call) is a candidate
    c, h = metrics["skip_rounds_max"], metrics["skip_rounds_margin"]
    best = found[(c, round(h, 4))]
    assert best == max(found.values()) and all(v < best for (d, _), v in found.items() if d > c)
    caps = {d: v for (d, m), v in found.items() if m == 0}
    gate = Gate(metrics["skip_rest_below"], metrics["skip_rest_max_target_ms"])
    assert caps[0] == pytest.approx(walks[f"student_skip_rest_below_{gate.key}"])
    manifest = json.loads((Path(params.distill.out_dir) / "student.json").read_text())
    assert manifest.get("skip_rounds_max", 0) == c
    assert manifest.get("skip_rounds_margin", 0.0) == (h if c else 0.0)
    exported = load_scheduler(Path(params.export.out_dir) / "scheduler.json")
    assert exported.manifest.get("skip_rounds_max", 0) == c
    assert exported.engaged_above == pytest.approx(exported.threshold - (h if c else 0.0))


def test_distill_puts_the_student_beside_every_fixed_schedule_per_report(run_all):
    """The per-report table: the exported student's walk (its gate and backoff) averages to the
    walk distill chose c and h by, All-Small's to the fixed-schedule walk computed on its own, and
    the report's best fixed schedule is at least both endpoints; the summary counts agree."""
    params, res = run_all
    metrics = res["distill"]
    rows, walks = metrics["round_walk_by_report"], metrics["decision_priced_walk_pct"]
    assert len(rows) == len({r["report_id"] for r in rows}) >= 2
    c, h = metrics["skip_rounds_max"], metrics["skip_rounds_margin"]
    assert np.mean([r["student"] for r in rows]) == pytest.approx(walks[backoff_key(c, h)])
    assert np.mean([r["all_small"] for r in rows]) == pytest.approx(walks["all_small"])
    for r in rows:
        assert r["best_fixed"] >= max(r["all_small"], r["all_mid"]) and len(r["best_schedule"]) == 5
        if r["best_schedule"] == "00000":
            assert r["best_fixed"] == r["all_small"]
    vs = metrics["round_walk_vs_fixed"]
    gaps = [100 * (r["student"] / r["best_fixed"] - 1) for r in rows]
    assert [r["vs_best_fixed_pct"] for r in rows] == pytest.approx(gaps)
    ends = [100 * (r["student"] / max(r["all_small"], r["all_mid"]) - 1) for r in rows]
    assert [r["vs_better_endpoint_pct"] for r in rows] == pytest.approx(ends)
    assert vs["vs_better_endpoint_mean_pct"] == pytest.approx(np.mean(ends))
    assert vs["reports"] == len(rows) and vs["within_1pct_of_best_fixed"] == sum(g >= -1 for g in gaps)
    assert vs["vs_best_fixed_worst_pct"] == pytest.approx(min(gaps))
    assert vs["within_1pct_of_better_endpoint"] >= vs["within_1pct_of_best_fixed"]
    text = (Path(params.distill.out_dir) / "offline.md").read_text()
    assert [rows[0]["report_id"], f"{rows[0]['student']:.1f}%"] in [r[:2] for r in md_rows(text)]
