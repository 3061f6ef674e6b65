"""What the evaluation stages decode: the exported policies and each pair's checked deployment bundle.

Contract: every policy is loaded and validated by the decoder (decoder.deploy.deployment,
decoder.deploy.scheduler) from the export and deploy stages' folders named in params; a bundle
written from other inputs than the ones the stage decodes with (tree, runtime costs, student) is
stale and fails with a ValueError naming the field. Shared by ``evaluate`` (priced rows, the
``deployed`` row) and ``wall_check`` (the same policies decoded for real), which both start with
:func:`load_evaluated`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collectors.collect.plan import profile_for, tree_config
from collectors.evaluation.eval_report import DEPLOYED
from collectors.evaluation.priced_eval import ENDPOINTS
from collectors.evaluation.priced_tasks import budget_policy, decode_config
from config.params import Params, resolve
from decoder.core.config import TreeConfig
from decoder.deploy.deployment import Deployment, load_deployment, threshold_variants, variant_name
from decoder.deploy.runtime_costs import runtime_costs
from decoder.deploy.scheduler import LearnedScheduler, load_value_planner


def exported_students(params: Params, offsets: Sequence[float]) -> dict[str, LearnedScheduler]:
    """The exported student (``export.out_dir``) at every threshold offset (the pair check's:
    models.offline.THRESHOLD_OFFSETS), by decoder.deploy.deployment.variant_name."""
    tree = tree_config(params.tree)
    path = resolve(params.export.out_dir) / "scheduler.json"
    return threshold_variants(path, tree.depth, tree.width, offsets)


def learned_policies(params: Params, students: Mapping[str, LearnedScheduler]) -> dict[str, object]:
    """The value planner (loaded and validated) and the student at its exported threshold (from
    ``students``, which :func:`exported_students` loaded and validated)."""
    tree = tree_config(params.tree)
    export = resolve(params.export.out_dir)
    return {
        "value-planner": load_value_planner(export / "value_planner.json", tree.depth, tree.width),
        "student": students[variant_name(0.0)],
    }


def deployed_checks(
    params: Params, tree_of: Mapping[str, TreeConfig], students: Mapping[str, LearnedScheduler]
) -> dict[str, Deployment]:
    """Every evaluated pair's deployment bundle (``deploy.out_dir``), loaded and checked by the
    decoder, whose tree, runtime costs and student must be the ones the stage decodes the pair with
    (``tree_of``, the pair's profile, the exported student, one of whose ``students`` it deploys, an
    endpoint, or the budget stage's fixed schedule for the pair): a bundle written from other inputs
    is stale, its rows would not be what it deploys."""
    root = resolve(params.deploy.out_dir)
    student = students[variant_name(0.0)].manifest["manifest_sha256"]
    out = {}
    for pair_id, tree in tree_of.items():
        d = load_deployment(root, pair_id)
        costs = runtime_costs(profile_for(params, pair_id), tree)
        deploys = d.decision["deploys"]
        budget = budget_policy(params, pair_id)
        fixed = (*ENDPOINTS, *([budget] if budget else []))
        for what, bundle, here in (
            ("tree", d.config.tree, tree),
            ("runtime costs", d.costs, costs),
            ("student manifest_sha256", d.record["student_manifest_sha256"], student),
            (
                "policy",
                deploys,
                deploys if deploys in (*students, *fixed) else f"a student or {', '.join(fixed)}",
            ),
        ):
            if bundle != here:
                raise ValueError(
                    f"{d.folder}: the bundle's {what} {bundle} differ from the pair's {here}; "
                    "rerun the deploy stage"
                )
        out[pair_id] = d
    return out


def pair_check_of(d: Deployment) -> dict:
    """The bundle's pair check as evaluate reports it: {"deploys", "prompts", "speedup", "preferred",
    "margin" (the choice's paired speedup over the preferred option, [point, low, high]),
    "adaptive" (the adaptive rule's chosen variant)}."""
    return {**{k: d.decision[k] for k in ("deploys", "prompts", "speedup", "preferred", "margin")},
            "adaptive": d.adaptive.name}  # fmt: skip


def deployed_variants(deployments: Mapping[str, Deployment]) -> dict:
    """{pair id: {"deployed": the bundle's policy}} for the pairs whose bundle deploys the student at
    a shifted threshold: only those deploy a policy of their own under the name ``deployed``; every
    other pair's deployed row is a copy of the row of the method it deploys (the same policy)."""
    return {
        pair_id: {DEPLOYED: d.policy}
        for pair_id, d in deployments.items()
        if d.is_learned and d.decision["deploys"] != variant_name(0.0)
    }


@dataclass(frozen=True)
class Evaluated:
    """What an evaluation stage decodes, every part loaded and checked by the decoder."""

    students: dict[str, LearnedScheduler]  # the exported student at every threshold offset
    learned: dict[str, object]  # "value-planner" and "student" (:func:`learned_policies`)
    deployments: dict[str, Deployment]  # every pair's checked bundle (:func:`deployed_checks`)


def check_registered(params: Params, pairs: Sequence[str], field: str) -> None:
    """A ValueError naming ``field`` when any of ``pairs`` is not in the pair registry."""
    unknown = [p for p in pairs if p not in params.pairs]
    if unknown:
        raise ValueError(f"{field}: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}")


def load_evaluated(params: Params, pairs: Sequence[str], offsets: Sequence[float]) -> Evaluated:
    """The exported students at ``offsets``, the learned policies and the bundles of ``pairs`` (each
    checked against the tree the stage decodes the pair with), as evaluate and wall_check load them."""
    students = exported_students(params, offsets)
    trees = {p: decode_config(params, p).tree for p in pairs}
    return Evaluated(students, learned_policies(params, students), deployed_checks(params, trees, students))
