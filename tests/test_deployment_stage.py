"""The deploy stage (pipeline/deploy.py main) on hand-made inputs, its pair check stubbed: a bundle
per evaluated pair and an index, each bundle holding the pair's tree, the runtime costs of its
profile, its models and provenance; evaluate takes exactly these bundles and refuses a stale one."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from test_latency import linear_profile
from test_scheduler_export import student_artifact

from collectors.collect.plan import profile_for, tree_config
from collectors.collect.records import runtime_for
from collectors.evaluation import deployed
from collectors.pricing.profile_passes import save_profile
from config.params import load_params, restrict
from decoder import DeploymentError, load_deployment
from decoder.deploy.deployment import threshold_variants
from decoder.io.files import sha256_of_file
from models.offline import THRESHOLD_OFFSETS
from pipeline import deploy

# the params the stage reads (its dvc.yaml entry): a read of anything else fails under restrict
DEPLOY_PARAMS = (
    "overlay", "deploy", "tree", "pairs", "runtime", "data.out_dir", "zoo.out_dir", "profile.out_dir",
    "budget.out_dir", "budget.mode", "export.out_dir", "collect.prompt_start", "collect.prompts_per_report",
    "collect.max_prompt_tokens", "collect.seed", "evaluate.pairs", "evaluate.datasets",
    "evaluate.held_out_datasets", "evaluate.prompt_start", "evaluate.workers", "evaluate.max_new_tokens",
)  # fmt: skip


def _check(deploys: str, speedup: dict[str, float], adaptive: str) -> dict:
    paired = {"student": [1.0, 1.0, 1.0], deploys: [1.05, 1.01, 1.1]}
    rule = {"chosen": adaptive, "paired": {adaptive: [1.0, 1.0, 1.0]}}
    return {"deploys": deploys, "prompts": 4, "speedup": speedup, "preferred": "student", "paired": paired,
            "margin": paired[deploys], "adaptive": rule}  # fmt: skip


CHECKS = {
    "zoo-m": _check("student:-0.50", {"all-small": 1.1, "all-mid": 1.0}, "adaptive:0.05:8"),
    "zoo-s": _check("all-small", {"all-small": 1.2, "all-mid": 0.9}, "adaptive:0.15:16"),
    # the budget stage's fixed schedule, deployed by its bits
    "zoo-chat-m": _check("10000", {"all-small": 1.0, "all-mid": 1.1, "budget": 1.3}, "adaptive:0:4"),
}
BUDGET_POLICY = {"zoo-chat-m": "10000"}  # the budget stage's schedules, where a pair has one
REPORTED = ("deploys", "prompts", "speedup", "preferred", "margin")  # what evaluate reports of a check


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy_stage")
    dirs = {s: str(root / s) for s in ("export", "deploy", "profile", "zoo")}
    overrides = {s: {"out_dir": d} for s, d in dirs.items()}
    overrides |= {"mlflow": {"db": str(root / "mlflow.db")}, "budget": {"mode": "fixed"}}
    overrides["evaluate"] = {"pairs": list(CHECKS)}
    params = restrict(load_params(profile="smoke", overrides=overrides), "deploy", DEPLOY_PARAMS)
    student_artifact(root / "export" / "scheduler", seed=4, y_mean=-0.35, threshold=-0.54)
    for i, pair_id in enumerate(CHECKS):
        save_profile(
            dataclasses.replace(linear_profile(1.0 + i), pair=pair_id), root / "profile" / f"{pair_id}.json"
        )
        for folder in params.pair_paths(pair_id):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps({"name": folder.name}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deploy, "pair_checks", lambda params, students: {p: dict(c) for p, c in CHECKS.items()})
        # the MLflow run needs the stage's dvc.yaml entry (params, deps): tracking is tested elsewhere
        mp.setattr(deploy, "stage_run", lambda stage, params: contextlib.nullcontext())
        mp.setattr(deploy, "log_metrics", lambda metrics: None)
        digests = deploy.main(params)
    return params, root, digests


def test_the_stage_writes_a_checked_bundle_per_pair(staged):
    params, root, digests = staged
    index = json.loads((root / "deploy" / "index.json").read_text())
    assert sorted(index["pairs"]) == sorted(CHECKS) == sorted(digests)
    tree = tree_config(params.tree)
    for pair_id, check in CHECKS.items():
        d = load_deployment(root / "deploy", pair_id, expect_sha256=digests[pair_id])
        assert {k: d.decision[k] for k in REPORTED} == {k: check[k] for k in REPORTED}
        assert d.adaptive.name == check["adaptive"]["chosen"]
        assert d.config.tree == tree and d.config.max_new_tokens == params.evaluate.max_new_tokens
        assert d.runtime(37) == runtime_for(profile_for(params, pair_id), 37, tree)
        target, mid = params.pair_paths(pair_id)
        assert (d.models.target, d.models.mid) == (target.resolve(), mid.resolve())
        inputs = d.record["provenance"]["inputs"]
        assert inputs["scheduler.json"] == sha256_of_file(root / "export" / "scheduler.json")
        assert inputs["profile"] == sha256_of_file(root / "profile" / f"{pair_id}.json")
    assert load_deployment(root / "deploy", "zoo-m").policy.threshold == pytest.approx(-0.54 - 0.5)
    assert load_deployment(root / "deploy", "zoo-s").policy == "all-small"


def test_evaluate_takes_the_bundles_and_refuses_a_stale_one(staged, monkeypatch):
    params, root, _ = staged
    monkeypatch.setattr(deployed, "budget_policy", lambda params, pair_id: BUDGET_POLICY.get(pair_id))
    tree = tree_config(params.tree)
    students = threshold_variants(
        root / "export" / "scheduler.json", tree.depth, tree.width, THRESHOLD_OFFSETS
    )
    got = deployed.deployed_checks(params, dict.fromkeys(CHECKS, tree), students)
    assert {p: deployed.pair_check_of(d) for p, d in got.items()} == {
        p: {**{k: c[k] for k in REPORTED}, "adaptive": c["adaptive"]["chosen"]} for p, c in CHECKS.items()
    }
    assert list(deployed.deployed_variants(got)) == ["zoo-m"]
    assert deployed.deployed_variants(got)["zoo-m"]["deployed"] is got["zoo-m"].policy
    with pytest.raises(ValueError, match=r"zoo-m: the bundle's tree .* rerun the deploy stage"):
        deployed.deployed_checks(params, {"zoo-m": dataclasses.replace(tree, budget=7)}, students)
    with pytest.raises(DeploymentError, match="no pair 'zoo-l'"):
        deployed.deployed_checks(params, {"zoo-l": tree}, students)
    # a fixed schedule other than the budget stage's for the pair (which may have moved): stale
    monkeypatch.setattr(deployed, "budget_policy", lambda params, pair_id: "01000")
    with pytest.raises(ValueError, match=r"zoo-chat-m: the bundle's policy 10000 .* all-mid, 01000"):
        deployed.deployed_checks(params, {"zoo-chat-m": tree}, students)
