"""DVC stage ``deploy``: one deployment bundle per evaluated pair, what the decoder loads and runs.

The pair check decides what each pair deploys: the exported student at every threshold of
THRESHOLD_OFFSETS, All-Small and All-Mid, replayed and priced on the pair's calibration prompts
(the collect.prompts_per_report questions right after the collect slice, of every fitting dataset:
no training state came from them, and they end before evaluate's held-back prompts). In a stated
order of preference, the student at its exported threshold first, then its other thresholds by
distance from it, then the endpoints: the preferred option is kept unless another prices faster
by more than its paired 95% interval over those prompts (collectors/evaluation/pair_check.py), so a
near-tie never flips the choice. The same rule picks the online adaptive rule's thresholds among
decoder.core.adaptive.GRID, its defaults preferred: the baseline evaluate sets beside the student.
The endpoints and the prompts' continuations come priced from the evaluate_fixed stage
(calibration.json); only the students and the adaptive variants are replayed here.
Writes ``<deploy.out_dir>/<pair>/`` per pair (the student, deployment.json with the decision, the
pair's tree from the budget stage, the runtime costs from its profile, the models, provenance;
checksums.json: decoder/deploy/deployment.py) and ``<deploy.out_dir>/index.json`` with each pair's
checksums digest. evaluate scores these bundles.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from collectors.collect.plan import digest_folder, pair_tree, profile_for, profile_path, tree_config
from collectors.evaluation.deployed import check_registered
from collectors.evaluation.fixed_cells import calibration_path, read_fixed
from collectors.evaluation.pair_check import choose, pair_check
from collectors.evaluation.priced_eval import ENDPOINTS
from collectors.evaluation.priced_tasks import (
    BUDGET,
    calibration_range,
    decode_config,
    policy_name_of,
    priced_cells,
)
from collectors.pricing.budget_file import budgets_path
from config.params import Params, resolve
from decoder.core.adaptive import GRID, AdaptiveTiers, parse_adaptive
from decoder.deploy.bundle import is_pair_name
from decoder.deploy.deployment import threshold_variants, tree_record, variant_name
from decoder.deploy.latency import LatencyProfile
from decoder.deploy.record import SCHEMA_VERSION, is_fallback
from decoder.deploy.runtime_costs import runtime_costs
from decoder.deploy.scheduler import LearnedScheduler, read_artifact
from decoder.io.files import sha256_of_file
from models.bundle import write_index, write_pair_bundle
from models.offline import THRESHOLD_OFFSETS
from pipeline.cli import run_stage
from pipeline.provenance import git_revision
from pipeline.registry import register_bundles
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)


def pair_checks(params: Params, students: Mapping[str, LearnedScheduler]) -> dict[str, dict]:
    """Per evaluated pair, what it deploys and the adaptive rule's thresholds (module docstring):
    collectors.evaluation.pair_check.pair_check's record with "adaptive" added. The endpoints come
    priced from the evaluate_fixed stage (no best fixed schedule in hindsight); the students and the
    adaptive variants are replayed here from its continuations."""
    cfg = params.evaluate
    datasets = [d for d in cfg.datasets if d not in cfg.held_out_datasets]
    cells = [(p, d) for p in cfg.pairs for d in datasets]
    prompts = calibration_range(
        params.collect.prompt_start, params.collect.prompts_per_report, cfg.prompt_start
    )
    parts, _ = read_fixed(calibration_path(resolve(cfg.out_dir)), cells)  # the endpoints, priced
    adaptive = {t.name: AdaptiveTiers(t) for t in GRID}
    with tqdm(total=len(cells) * prompts[1], desc="deploy (pair check)", unit="prompt") as bar:
        priced = priced_cells(params, cells, {**students, **adaptive}, {}, bar.update, prompts, False, parts)
    out = {}
    for pair_id in cfg.pairs:
        cells_of_pair = [priced[(pair_id, d)] for d in datasets]
        fixed = [*ENDPOINTS, *([BUDGET] if all(BUDGET in c.methods for c in cells_of_pair) else [])]
        check = pair_check(cells_of_pair, (*preference_order(students), *fixed))
        if check["deploys"] == BUDGET:  # the budget stage's schedule, deployed by its own name
            check["deploys"] = policy_name_of(cells_of_pair[0].methods[BUDGET].schedule)
        chosen, paired = choose(cells_of_pair, [t.name for t in GRID])
        check["adaptive"] = {"chosen": chosen, "paired": {n: list(v) for n, v in paired.items()}}
        out[pair_id] = check
        point, low, high = check["margin"]
        log.info("%s: the pair check deploys %s (%.3fx [%.3f, %.3f] against %s); adaptive %s", pair_id,
                 check["deploys"], point, low, high, check["preferred"], chosen)  # fmt: skip
    return out


def preference_order(students: Mapping[str, LearnedScheduler]) -> tuple[str, ...]:
    """The threshold variants, the exported one first, then by distance from it (lower first)."""
    offset = {variant_name(o): o for o in THRESHOLD_OFFSETS}
    return tuple(sorted(students, key=lambda name: (abs(offset[name]), offset[name])))


def decision_of(check: Mapping[str, Any], students: Mapping[str, LearnedScheduler]) -> dict[str, object]:
    """The pair check's result as deployment.json's ``decision`` (decoder/deploy/record.py): the
    threshold offset and the threshold it decodes at for a student, both null for a fallback; the
    paired margins; the adaptive rule's chosen thresholds."""
    deploys = str(check["deploys"])
    if is_fallback(deploys):
        offset, threshold = None, None
    else:
        offset = next(o for o in THRESHOLD_OFFSETS if variant_name(o) == deploys)
        threshold = students[deploys].threshold
    rule = parse_adaptive(check["adaptive"]["chosen"])
    adaptive = {"margin": rule.margin, "probe": rule.probe, "paired": dict(check["adaptive"]["paired"])}
    return {
        "deploys": deploys, "threshold_offset": offset, "threshold": threshold, "prompts": check["prompts"],
        "speedup": dict(check["speedup"]), "preferred": check["preferred"], "paired": dict(check["paired"]),
        "margin": list(check["margin"]), "adaptive": adaptive,
    }  # fmt: skip


def _relative(path: Path, folder: Path) -> str:
    """``path`` relative to the bundle folder (the bundle moves with its repository), or absolute
    where no relative path exists (another drive)."""
    try:
        return os.path.relpath(path, folder)
    except ValueError:
        return str(path.resolve())


def pair_record(
    params: Params, pair_id: str, decision: Mapping[str, object], folder: Path, profile: LatencyProfile
) -> dict[str, object]:
    """deployment.json of one pair (decoder/deploy/deployment.py): its decision, the tree and decoding
    settings evaluate decodes it with, the runtime costs at that tree, models and provenance."""
    config = decode_config(params, pair_id)
    tree = pair_tree(params, pair_id)
    spec, (target, mid) = params.pairs[pair_id], params.pair_paths(pair_id)
    costs = runtime_costs(profile, tree)
    student = resolve(params.export.out_dir) / "scheduler"
    inputs = {
        "scheduler.json": sha256_of_file(student.with_suffix(".json")),
        "scheduler.safetensors": sha256_of_file(student.with_suffix(".safetensors")),
        "profile": sha256_of_file(profile_path(params, pair_id)),
        "target": digest_folder(target),
        **({"mid": digest_folder(mid)} if spec.mid else {}),
        **({"budgets.json": sha256_of_file(budgets_path(params))} if params.budget.mode != "fixed" else {}),
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "pair_id": pair_id,
        "decision": dict(decision),
        "tree": tree_record(tree),
        "decode": {
            "max_new_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "seed": config.seed,
        },
        "runtime": {"target_ms": costs.target_ms, "mid_ms": costs.mid_ms},
        "models": {
            "target": _relative(target, folder),
            "mid": _relative(mid, folder) if spec.mid else None,
            "dtype": spec.dtype,
            "device": spec.device,
            "linear": spec.linear,
            "template": spec.template,
        },
        "profile": {"pair": profile.pair, "device": profile.device, "sha256": inputs["profile"]},
        "provenance": {"git_revision": git_revision(), "inputs": inputs},
        "student_manifest_sha256": read_artifact(student.with_suffix(".json"), "student").manifest[
            "manifest_sha256"
        ],
    }


def main(params: Params) -> dict[str, str]:
    """Check every evaluated pair, write its bundle and the index; returns {pair: checksums sha256}."""
    apply_runtime(params)
    cfg = params.evaluate
    check_registered(params, cfg.pairs, "evaluate.pairs")
    folders = [p for p in cfg.pairs if not is_pair_name(p)]
    if folders:
        raise ValueError(f"evaluate.pairs: pair ids {folders} cannot name a bundle folder")
    out = resolve(params.deploy.out_dir)
    student = resolve(params.export.out_dir) / "scheduler.json"
    with stage_run("deploy", params):
        tree = tree_config(params.tree)
        students = threshold_variants(student, tree.depth, tree.width, THRESHOLD_OFFSETS)
        checks = pair_checks(params, students)
        digests = {}
        for pair_id, check in checks.items():
            folder = out / pair_id
            record = pair_record(
                params, pair_id, decision_of(check, students), folder, profile_for(params, pair_id)
            )
            digests[pair_id] = write_pair_bundle(
                folder, record, student.with_suffix(""), profile_path(params, pair_id)
            )
            log.info("%s: wrote %s (checksums sha256 %s)", pair_id, folder, digests[pair_id])
        write_index(out, digests)
        versions = register_bundles(out, digests)
        log.info("registered model versions: %s", versions)
        log_metrics({"pair_check": checks})
    return digests


if __name__ == "__main__":
    run_stage("deploy", main)
