"""DVC stage ``evaluate``: the paper's main table and ablations on held-back prompts.

Per (pair, dataset) cell, the primary metric is the priced speedup over autoregressive decoding:
All-Small, All-Mid, 10101, the best fixed schedule in hindsight, the value planner and the exported
student, every one replayed exactly on ``evaluate.prompts_per_cell`` prompts and priced with the
pair's latency profile (collectors/evaluation/priced_eval.py), with a bootstrap 95% interval over prompts.
The ``deployed`` row of each pair is what its deployment bundle says (the ``deploy`` stage's pair
check, loaded with decoder.load_deployment and checked against the tree this stage decodes with):
this stage decides nothing itself.
This part runs in ``evaluate.workers`` processes, cells sharing a target computing its work once
(collectors/evaluation/priced_tasks.py). As the check, afterwards and with no worker alive, the first
``wall_prompts_per_cell`` prompts are also decoded for real by ``wall_methods`` and autoregressive
decoding, side by side with identical warm-up (the full warm-up on a pair's first cell, a token on
its later cells, already warm) (wall clock, with a bootstrap interval), a fast pair's prompts again
and again until autoregressive decoding's runs of each last ``wall_min_ar_s`` (at most
``wall_max_repeats`` runs; every method keeps its run of median wall time); any output
that differs from autoregressive decoding fails the stage. Each pair is profiled again (one pass of
the profile stage's measurement) just before its first wall-clock cell, and the decodes' counts are
priced with both profiles: the check of the cost model on the machine as it ran, beside the check
of the stage's prices, which also moves with how much faster or slower the machine has become
(``pricing_agreement`` and ``profile_drift`` in metrics.json, the profiles under ``profiles/``).
Held-out pairs (never collected) and tasks (never fitted) are marked. Ablations under the fixed
schedule (full, no extended grafting, overwrite grafting, sequential cascade) are decoded for real
with the mechanism statistics. Writes under evaluate.out_dir: results.json, table.md, wall.md,
ablations.md, metrics.json, plots (PNG + CSV for `dvc plots`) and Spec-Bench answer files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from collectors.collect.plan import load_registered_pair, profile_for, tree_config
from collectors.evaluation.cell import evaluate_cell
from collectors.evaluation.eval_report import (
    ablation_table,
    calls_plot,
    main_table,
    plot_rows,
    pricing_agreement,
    speedup_plot,
    summary_metrics,
    wall_table,
)
from collectors.evaluation.priced_eval import (
    ENDPOINTS,
    PricedCell,
    bootstrap_speedup,
    fastest,
    pooled_speedups,
)
from collectors.evaluation.priced_tasks import cell_inputs, decode_config, priced_cells
from collectors.pricing.latency import LatencyProfile, compare_profiles, save_profile
from collectors.pricing.profile_settings import measure_with_settings
from config.params import Params, resolve
from decoder.config import Grafting, TreeConfig
from decoder.deployment import Deployment, load_deployment, variant_name
from decoder.measure import Method, Repeats
from decoder.models import ModelPair
from decoder.policies import AR
from decoder.runtime_costs import runtime_costs
from decoder.scheduler import LearnedScheduler, load_value_planner
from models.offline import THRESHOLD_OFFSETS
from pipeline.cli import run_stage
from pipeline.deploy import FIXED_METHODS as ENDPOINT_SCHEDULES
from pipeline.deploy import threshold_variants
from pipeline.registry import promote_champions
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_figure, log_files, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)


def learned_policies(params: Params, students: Mapping[str, LearnedScheduler]) -> dict[str, object]:
    """The value planner (loaded and validated) and the student at its exported threshold (from
    :func:`threshold_variants`, which loaded and validated it)."""
    tree = tree_config(params.tree)
    export = resolve(params.export.out_dir)
    return {
        "value-planner": load_value_planner(export / "value_planner.json", tree.depth, tree.width),
        "student": students[variant_name(0.0)],
    }


FIXED_METHODS = {**ENDPOINT_SCHEDULES, "10101": "10101"}
DEPLOYED = "deployed"  # per pair, what its deployment bundle deploys (the deploy stage's pair check)


def deployed_checks(
    params: Params, tree_of: Mapping[str, TreeConfig], students: Mapping[str, LearnedScheduler]
) -> dict[str, Deployment]:
    """Every evaluated pair's deployment bundle (``deploy.out_dir``), loaded and checked by the
    decoder, whose tree, runtime costs and student must be the ones this stage decodes the pair with
    (``tree_of``, the pair's profile, the exported student, one of whose ``students`` it deploys or a
    fallback): a bundle written from other inputs is stale, its rows would not be what it deploys."""
    root = resolve(params.deploy.out_dir)
    student = students[variant_name(0.0)].manifest["manifest_sha256"]
    out = {}
    for pair_id, tree in tree_of.items():
        d = load_deployment(root, pair_id)
        costs = runtime_costs(profile_for(params, pair_id), tree)
        deploys = d.decision["deploys"]
        for what, bundle, here in (
            ("tree", d.config.tree, tree),
            ("runtime costs", d.costs, costs),
            ("student manifest_sha256", d.record["student_manifest_sha256"], student),
            ("policy", deploys, deploys if deploys in (*students, *ENDPOINTS) else "a student or endpoint"),
        ):
            if bundle != here:
                raise ValueError(
                    f"{d.folder}: the bundle's {what} {bundle} differ from the pair's {here}; "
                    "rerun the deploy stage"
                )
        out[pair_id] = d
    return out


def pair_check_of(d: Deployment) -> dict:
    """The bundle's pair check as evaluate reports it: {"deploys", "prompts", "speedup"}."""
    return {k: d.decision[k] for k in ("deploys", "prompts", "speedup")}


def deployed_variants(deployments: Mapping[str, Deployment]) -> dict:
    """{pair id: {"deployed": the bundle's policy}} for the pairs whose bundle deploys the student at
    a shifted threshold: those are decoded for real under the name ``deployed``; every other pair's
    deployed row is a copy of the row of the method it deploys (the same policy)."""
    return {
        pair_id: {DEPLOYED: d.policy}
        for pair_id, d in deployments.items()
        if d.is_learned and d.decision["deploys"] != variant_name(0.0)
    }


def _priced_rows(cell, n_boot: int) -> dict[str, dict]:
    out = {}
    for name, (point, low, high) in cell.speedups(n_boot).items():
        m = cell.methods[name]
        out[name] = {
            "method": name,
            "schedule": m.schedule,
            "n_prompts": len(m.ms),
            "n_tokens": int(m.tokens.sum()),
            "priced_tokens_per_s": 1e3 * float(m.tokens.sum() / m.ms.sum()),
            "priced_speedup": point,
            "priced_ci_low": low,
            "priced_ci_high": high,
            "mean_accepted_length": m.accepted,
            "mid_call_rate": float(sum(m.mid_calls_per_step) / len(m.mid_calls_per_step)),
            "mid_calls_per_step": list(m.mid_calls_per_step),
            "speedup": None,  # wall clock: only for the methods decoded for real
            "wall_ci_low": None,
            "wall_ci_high": None,
            "mid_pool_mean": None,
            "historical_pick_share": None,
        }
    return out


# Warm-up tokens per method before a cell's timed runs: the full warm-up on a pair's first cell,
# a token on its later cells (the same models and methods decoded just before, so already warm).
WARMUP_TOKENS, WARM_AGAIN_TOKENS = 16, 1


def profile_beside(params: Params, pair: ModelPair, pair_id: str) -> LatencyProfile:
    """One pass of the profile stage's measurement of the pair (``params.profile``'s settings, the
    stage's tree): taken just before the pair's wall-clock cells, it prices their decodes as the
    machine ran them, so that the pricing check tells a wrong cost model from a machine that is
    faster or slower than when the stage profiled it (the training prices stay the stage's)."""
    return measure_with_settings(pair, pair_id, params.profile, tree_config(params.tree))


def profile_drift(stage: LatencyProfile, beside: LatencyProfile) -> dict[str, float]:
    """Per component, the re-measured profile over the stage's (geometric mean over the points both
    measured): below 1, the machine ran that part faster than when it was profiled."""
    return {a.component: a.geomean_ratio for a in compare_profiles(stage, beside)}


def wall_repeats(params: Params) -> Repeats:
    """How often a decoded-for-real prompt is timed (``evaluate.wall_min_ar_s``, ``wall_max_repeats``)."""
    return Repeats(params.evaluate.wall_min_ar_s, params.evaluate.wall_max_repeats)


def _wall_rows(
    params: Params, pair, questions, prompts, methods, config, runtime, profile, warmup, beside, repeats
) -> tuple:
    cell = evaluate_cell(pair, questions, prompts, methods, config, runtime, profile, warmup, beside, repeats)
    ar = np.array([r.wall_s for r in cell.results[AR]])
    ar_decode = ar - np.array([r.prefill_s for r in cell.results[AR]])
    rows = {}
    for row in cell.rows:
        res = cell.results[row["method"]]
        wall = np.array([r.wall_s for r in res])
        point, low, high = bootstrap_speedup(ar, wall, params.evaluate.bootstrap)
        decode = wall - np.array([r.prefill_s for r in res])
        rows[row["method"]] = {
            **row,
            "speedup": point,
            "wall_ci_low": low,
            "wall_ci_high": high,
            # prefill excluded, as in the priced figures: the pricing check compares these two
            "wall_decode_speedup": float(ar_decode.sum() / decode.sum()),
            **{f"lossless_{k}": v for k, v in cell.lossless.get(row["method"], {}).items()},
        }
    return rows, cell.answers


def _evaluate_cells(
    params: Params,
    cells: list[tuple[str, str]],
    out: Path,
    policies: dict,
    deployments: Mapping[str, Deployment],
    students: Mapping[str, LearnedScheduler],
    repeats: Repeats,
) -> tuple[list[dict], dict[tuple[str, str], PricedCell], dict[str, dict[str, float]]]:
    """Every cell's priced rows (in ``evaluate.workers`` processes), then, with no worker alive, the
    wall-clock rows cell by cell in this process, each pair profiled again (:func:`profile_beside`,
    written to ``<out>/profiles/<pair>.json``) just before its first cell; returns the rows, the
    priced cells and each pair's :func:`profile_drift`. Each cell also gets a ``deployed`` row with
    ``deployed_as``: the method its pair's bundle deploys (``deployments``); where that is the student
    at a shifted threshold it is the bundle's policy decoded for real under that name, its priced
    figures those of its replay, else it is a copy of that method's row, renamed. Every one of
    ``students`` is replayed on every cell (the held-back check of the pair check's choice, from the
    returned priced cells); only the rows of ``policies``, the fixed methods and ``deployed`` are
    returned."""
    cfg = params.evaluate
    shifted = deployed_variants(deployments)
    extra = {n: p for n, p in students.items() if n not in policies}
    with tqdm(total=len(cells) * cfg.prompts_per_cell, desc="evaluate (priced replay)", unit="prompt") as bar:
        priced_by_cell = priced_cells(params, cells, {**policies, **extra}, FIXED_METHODS, bar.update)
    rows, warm_pair, beside, drift = [], None, None, {}
    for pair_id, dataset in tqdm(cells, desc="evaluate (wall clock)", unit="cell"):
        pair = load_registered_pair(params, pair_id)
        questions, prompts, profile, runtime = cell_inputs(
            params, pair_id, dataset, pair, cfg.prompts_per_cell
        )
        warmup = WARM_AGAIN_TOKENS if pair_id == warm_pair else WARMUP_TOKENS
        if pair_id != warm_pair:
            beside = profile_beside(params, pair, pair_id)
            save_profile(beside, out / "profiles" / f"{pair_id}.json")
            drift[pair_id] = profile_drift(profile, beside)
        warm_pair = pair_id
        config = decode_config(params, pair_id)
        priced = priced_by_cell[(pair_id, dataset)]
        log.info("%s %s: best fixed schedule in hindsight %s", pair_id, dataset, priced.best_fixed)
        by_method = _priced_rows(priced, cfg.bootstrap)
        n_wall = cfg.wall_prompts_per_cell
        named = {**FIXED_METHODS, "best-fixed": priced.best_fixed}
        wall_methods = [Method(m, policies[m] if m in policies else named[m]) for m in cfg.wall_methods]
        wall_methods += [Method(n, p) for n, p in shifted.get(pair_id, {}).items()]
        wall, answers = _wall_rows(
            params, pair, questions[:n_wall], prompts[:n_wall], wall_methods, config, runtime[:n_wall],
            profile, warmup, beside, repeats,
        )  # fmt: skip
        deploys = deployments[pair_id].decision["deploys"]
        for name, w in wall.items():
            keep = by_method.get(deploys if name == DEPLOYED else name, {})
            by_method[name] = {
                **w,
                **{k: keep[k] for k in ("schedule", "n_prompts", "n_tokens", "priced_tokens_per_s",
                                        "priced_speedup", "priced_ci_low", "priced_ci_high",
                                        "mean_accepted_length", "mid_call_rate", "mid_calls_per_step")
                   if k in keep},
                "wall_priced_speedup": w["priced_speedup"],  # the same counts priced, wall prompts only
                "wall_beside_priced_speedup": w["beside_priced_speedup"],  # ... with the pair re-profiled
                "wall_n_prompts": n_wall,
                "wall_of": name,  # decoded under this name (a deployed copy keeps its method's)
            }  # fmt: skip
        by_method[DEPLOYED] = {**by_method[DEPLOYED if pair_id in shifted else deploys],
                               "method": DEPLOYED, "deployed_as": deploys}  # fmt: skip
        for name in extra:
            del by_method[name]
        for row in by_method.values():
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
            rows.append(row)
        for method, records in answers.items():
            path = out / "specbench" / method / f"{pair_id}__{dataset}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(a) + "\n" for a in records))
    return rows, priced_by_cell, drift


def threshold_transfer(
    priced_by_cell: Mapping[tuple[str, str], PricedCell], checks: Mapping[str, dict], fitting: Sequence[str]
) -> dict[str, dict]:
    """The pair check's choice seen on the held-back prompts: per pair, the endpoints and the student
    at every threshold the check tried, pooled over the pair's cells of the ``fitting`` datasets
    (collectors.evaluation.priced_eval.pooled_speedups), with what the check chose on the calibration prompts
    (``chosen``) and the fastest threshold here (``held_back_best``; the first tried among equals)."""
    out = {}
    for pair_id, check in checks.items():
        speedup = pooled_speedups([priced_by_cell[(pair_id, d)] for d in fitting], tuple(check["speedup"]))
        learned = [m for m in speedup if m not in ENDPOINTS]
        out[pair_id] = {
            "chosen": check["deploys"],
            "held_back_best": fastest(speedup, learned),
            "speedup": speedup,
        }
    return out


def ablation_methods(params: Params, tree: TreeConfig) -> list[Method]:
    schedule = params.evaluate.ablation.schedule
    return [
        Method("full", schedule, tree),
        Method("no-eg", schedule, replace(tree, extended_grafting=False)),
        Method("overwrite", schedule, replace(tree, grafting=Grafting.OVERWRITE)),
        Method("cascade", schedule, replace(tree, sequential=True)),
    ]


def _ablation_cells(params: Params, cells: list[tuple[str, str]], repeats: Repeats) -> list[dict]:
    cfg = params.evaluate
    rows, warm_pair = [], None
    for pair_id, dataset in tqdm(cells, desc="ablations", unit="cell"):
        pair = load_registered_pair(params, pair_id)
        warmup = WARM_AGAIN_TOKENS if pair_id == warm_pair else WARMUP_TOKENS
        warm_pair = pair_id
        questions, prompts, profile, runtime = cell_inputs(
            params, pair_id, dataset, pair, cfg.wall_prompts_per_cell
        )
        config = decode_config(params, pair_id)
        methods = ablation_methods(params, config.tree)
        cell = evaluate_cell(
            pair, questions, prompts, methods, config, runtime, profile, warmup, repeats=repeats
        )
        for row in cell.rows:
            row.update(pair_id=pair_id, dataset_id=dataset, is_held_out_pair=pair_id in cfg.held_out_pairs,
                       is_held_out_task=dataset in cfg.held_out_datasets)  # fmt: skip
        rows += cell.rows
    return rows


def main(params: Params) -> dict:
    apply_runtime(params)
    cfg = params.evaluate
    unknown = [p for p in (*cfg.pairs, *cfg.ablation.pairs) if p not in params.pairs]
    if unknown:
        raise ValueError(f"evaluate: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}")
    if cfg.workers < 1:
        raise ValueError(f"evaluate.workers must be >= 1 (1: in this process), got {cfg.workers}")
    repeats = wall_repeats(params)  # bad wall_min_ar_s or wall_max_repeats fail here, before any work
    out = resolve(cfg.out_dir)
    depth = params.tree.depth
    with stage_run("evaluate", params):
        tree = tree_config(params.tree)
        students = threshold_variants(
            resolve(params.export.out_dir) / "scheduler.json", tree.depth, tree.width, THRESHOLD_OFFSETS
        )
        policies = learned_policies(params, students)
        deployments = deployed_checks(params, {p: decode_config(params, p).tree for p in cfg.pairs}, students)
        checks = {p: pair_check_of(d) for p, d in deployments.items()}
        cells = [(p, d) for p in cfg.pairs for d in cfg.datasets]
        rows, priced_by_cell, drift = _evaluate_cells(
            params, cells, out, policies, deployments, students, repeats
        )
        fitting = [d for d in cfg.datasets if d not in cfg.held_out_datasets]
        transfer = threshold_transfer(priced_by_cell, checks, fitting)
        ablations = _ablation_cells(
            params, [(p, d) for p in cfg.ablation.pairs for d in cfg.ablation.datasets], repeats
        )
        metrics = {
            **summary_metrics(rows),
            "pair_check": checks,
            "threshold_transfer": transfer,
            "pricing_agreement": pricing_agreement(rows),
            "profile_drift": drift,
        }
        table, wall, abl = main_table(rows), wall_table(rows), ablation_table(ablations)
        write_json(out / "results.json", {"main": rows, "ablations": ablations, "pair_check": checks})
        write_json(out / "metrics.json", metrics)
        (out / "table.md").write_text(table + "\n")
        (out / "wall.md").write_text(wall + "\n")
        (out / "ablations.md").write_text(abl + "\n")
        speed, calls = plot_rows(rows, depth)
        write_csv(out / "plots" / "speedup.csv", speed)
        write_csv(out / "plots" / "calls_per_step.csv", calls)
        log_figure(speedup_plot(rows, out / "speedup.png"), "speedup.png")
        log_figure(calls_plot(rows, depth, out / "calls_per_step.png"), "calls_per_step.png")
        log_metrics(metrics)
        log_files([out / name for name in ("table.md", "wall.md", "ablations.md", "results.json")])
        # every lossless gate held and each bundle was scored: its registered version is the champion
        champions = promote_champions({p: d.checksums_sha256 for p, d in deployments.items()})
        log.info("champion versions: %s", champions)
    print(table)
    print()
    print(wall)
    print()
    print(abl)
    return metrics


if __name__ == "__main__":
    run_stage("evaluate", main)
