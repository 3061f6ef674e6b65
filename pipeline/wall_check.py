"""DVC stage ``wall_check``: does the pricing agree with the clock? Runs after ``evaluate``.

Per evaluated pair, ``wall_check.prompts_per_pair`` of evaluate's held-back prompts (round-robin over
its datasets) are decoded for real by ``wall_check.methods`` and autoregressive decoding, side by
side with identical warm-up and in ``wall_check.order`` (lockstep: one round of each in turn);
where the pair's bundle deploys the student at a shifted threshold, that policy is decoded too, as
``deployed``. Any output that differs from autoregressive decoding
beyond a numerical near-tie fails the stage. A fast pair's prompts are timed again and again until
AR's runs of each last ``wall_check.min_ar_s`` (at most ``max_repeats`` runs; every method keeps its
run of median wall time). Each pair is profiled again (one pass of the profile stage's measurement)
just before its decodes. Per pair and method the stage reports priced / measured decoding speedup
with a bootstrap 95% interval over prompts, priced with the stage's profile and with the one taken
beside, and whether the interval lies within 0.90-1.10 (collectors/evaluation/wall_agreement.py),
beside evaluate's priced speedup of the same pair and method (its results.json); the decodes are
collectors/evaluation/wall_decode.py's. Writes under
wall_check.out_dir: wall.md, results.json, metrics.json, the profiles taken beside (profiles/) and
Spec-Bench answer files (specbench/). Last, each pair's bundle becomes the ``champion`` of its
registered model (pipeline/registry.py).
"""

from __future__ import annotations

import json
import logging

from tqdm import tqdm

from collectors.evaluation.deployed import check_registered, deployed_variants, load_evaluated
from collectors.evaluation.eval_report import ADAPTIVE
from collectors.evaluation.wall_agreement import agreement_summary, agreement_table, mark_rows
from collectors.evaluation.wall_decode import check_pair, wall_methods
from collectors.pricing.profile_passes import save_profile
from config.params import Params, resolve
from decoder.core.policies import AR
from decoder.measure import Repeats
from models.offline import THRESHOLD_OFFSETS
from pipeline.cli import run_stage
from pipeline.registry import promote_champions
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_files, log_metrics, stage_run, write_json

log = logging.getLogger(__name__)


def main(params: Params) -> dict:
    apply_runtime(params)
    cfg, pairs = params.wall_check, params.evaluate.pairs
    check_registered(params, pairs, "evaluate.pairs")
    repeats = Repeats(cfg.min_ar_s, cfg.max_repeats)
    out = resolve(cfg.out_dir)
    evaluated = resolve(params.evaluate.out_dir) / "results.json"
    if not evaluated.is_file():
        raise FileNotFoundError(f"{evaluated}: missing; run the evaluate stage first")
    with stage_run("wall_check", params):
        loaded = load_evaluated(params, pairs, THRESHOLD_OFFSETS)
        policies, deployments = loaded.learned, loaded.deployments
        # the online adaptive rule, at the thresholds each pair's check chose (its own object per decode)
        adaptive = {p: {ADAPTIVE: d.adaptive.name} for p, d in deployments.items()}
        wall_methods(
            cfg.methods, {**policies, ADAPTIVE: ADAPTIVE}, params.tree.depth
        )  # a bad name fails here
        shifted = deployed_variants(deployments)
        rows, drift, lossless = [], {}, {}
        # a pair deploying the budget stage's schedule (by its bits) decodes it too, under that name
        fixed = {p: [d.decision["deploys"]] for p, d in deployments.items()
                 if not d.is_learned and d.decision["deploys"] not in (*cfg.methods, AR)}  # fmt: skip
        for pair_id in tqdm(pairs, desc="wall_check", unit="pair"):
            names = [*cfg.methods, *shifted.get(pair_id, {}), *fixed.get(pair_id, [])]
            learned = {**policies, **adaptive[pair_id], **shifted.get(pair_id, {})}
            checked = check_pair(params, pair_id, names, learned, repeats)
            rows += checked.rows
            drift[pair_id], lossless[pair_id] = checked.drift, checked.lossless
            save_profile(checked.beside, out / "profiles" / f"{pair_id}.json")
            for (method, dataset), records in checked.answers.items():
                path = out / "specbench" / method / f"{pair_id}__{dataset}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(a) + "\n" for a in records))
        deploys = {p: d.decision["deploys"] for p, d in deployments.items()}
        main_rows = json.loads(evaluated.read_text())["main"]
        rows = mark_rows(rows, deploys, params.evaluate.held_out_pairs, main_rows)
        summary = agreement_summary(rows)
        agreement = {p: {r["method"]: r for r in rows if r["pair_id"] == p} for p in pairs}
        metrics = {"agreement": agreement, "summary": summary, "profile_drift": drift}
        table = agreement_table(rows)
        write_json(out / "results.json", {"rows": rows, "lossless": lossless})
        write_json(out / "metrics.json", metrics)
        (out / "wall.md").write_text(table + "\n")
        log_metrics(metrics)
        log_files([out / name for name in ("wall.md", "results.json")])
        # every deployed policy decoded losslessly (check_pair fails the stage otherwise) and was
        # priced by evaluate: each bundle's registered version becomes its pair's champion
        champions = promote_champions({p: d.checksums_sha256 for p, d in deployments.items()})
        log.info("champion versions: %s", champions)
    print(table)
    return metrics


if __name__ == "__main__":
    run_stage("wall_check", main)
