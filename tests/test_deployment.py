"""Deployment bundles (decoder/deploy/deployment.py, decoder/deploy/bundle.py, models/bundle.py,
pipeline/deploy.py): a bundle written from a student and a pair check's decision loads back into
the policy, tree and runtime the decoder decodes with (the same tokens and mid-call decisions as
the policy built by hand); every tampered, truncated, missing or re-checksummed file is one
DeploymentError naming it; the pair check's decision is stored as pair_checks computes it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import noisy_copy, tiny_model
from test_policy_replay import _prompts
from test_priced_eval import _cell_of
from test_scheduler_export import student_artifact
from test_switch_off import profile as hand_profile

import decoder
from collectors.evaluation.priced_eval import PricedMethod
from collectors.evaluation.priced_tasks import policy_name_of
from collectors.pricing.profile_passes import save_profile
from decoder.core.adaptive import GRID
from decoder.core.config import TreeConfig
from decoder.deploy.artifact import read_artifact
from decoder.deploy.bundle import CHECKSUMS_FILE, INDEX_FILE
from decoder.deploy.deployment import DEPLOYMENT_FILE, tree_record
from decoder.deploy.record import SCHEMA_VERSION, is_fallback
from decoder.deploy.scheduler import LearnedScheduler, check_features
from decoder.deploy.switch_off import SwitchOff, for_deployment
from decoder.generate import generate
from decoder.io.files import sha256_of_file
from decoder.models.pair import make_pair
from models.bundle import write_index, write_pair_bundle
from models.checksums import seal_folder
from models.offline import THRESHOLD_OFFSETS
from pipeline import deploy
from pipeline.evaluate import method_of

TREE = TreeConfig(budget=16, width=10, topk=4, ngram_min_n=2)
HEX = "0" * 64


def bundle_profile(student: Path) -> Path:
    """The latency profile a test bundle carries (test_switch_off's hand-made one), written once
    beside the student."""
    path = student.parent / "profile.json"
    if not path.is_file():
        save_profile(hand_profile(), path)
    return path


def record(student: Path, decision: dict, tree: TreeConfig = TREE, models: dict | None = None) -> dict:
    """A deployment.json for the student at ``student`` (its .json) and ``decision``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "pair_id": "tiny",
        "decision": decision,
        "tree": tree_record(tree),
        "decode": {"max_new_tokens": 24, "temperature": 0.0, "seed": 0},
        "runtime": {"target_ms": 2.0, "mid_ms": 1.0},
        "models": models
        or {
            "target": "t",
            "mid": "m",
            "dtype": "float32",
            "device": "cpu",
            "linear": "stock",
            "template": "zoo",
        },
        "profile": {"pair": "tiny", "device": "cpu", "sha256": sha256_of_file(bundle_profile(student))},
        "provenance": {"git_revision": "unknown", "inputs": {"scheduler.json": sha256_of_file(student)}},
        "student_manifest_sha256": read_artifact(student, "student").manifest["manifest_sha256"],
    }


def checked(deploys: str) -> dict:
    """The pair check's fields beside the choice (decoder/deploy/record.py Decision)."""
    paired = {"student": [1.0, 1.0, 1.0], deploys: [1.1, 1.02, 1.2]}
    adaptive = {"margin": 0.05, "probe": 8, "paired": {"adaptive:0.05:8": [1.0, 1.0, 1.0]}}
    return {"preferred": "student", "paired": paired, "margin": paired[deploys], "adaptive": adaptive}


def shifted(student: Path, offset: float) -> dict:
    base = float(read_artifact(student, "student").manifest["threshold"])
    name = "student" if offset == 0 else f"student:{offset:.2f}"
    return {"deploys": name, "threshold_offset": offset, "threshold": base + offset, "prompts": 6,
            "speedup": {"all-small": 1.2, "all-mid": 1.1, name: 1.3}, **checked(name)}  # fmt: skip


@pytest.fixture
def student(tmp_path) -> Path:
    _, path = student_artifact(tmp_path / "export" / "scheduler", seed=4, y_mean=-0.35, threshold=-0.54)
    return path


@pytest.fixture
def bundle(tmp_path, student) -> Path:
    """A bundle root holding the pair ``tiny`` (the student at offset -0.5)."""
    root = tmp_path / "deploy"
    digest = write_pair_bundle(
        root / "tiny",
        record(student, shifted(student, -0.5)),
        student.with_suffix(""),
        bundle_profile(student),
    )
    write_index(root, {"tiny": digest})
    return root


def by_hand(student: Path, offset: float) -> LearnedScheduler:
    """The student at its threshold plus ``offset``, built without decoder.deploy.deployment."""
    art = read_artifact(student, "student")
    signals = check_features(art.manifest, 5, 10)
    moved = {**art.manifest, "threshold": art.manifest["threshold"] + offset}
    return LearnedScheduler(replace(art, manifest=moved), signals)


def test_a_bundle_decodes_the_tokens_and_mid_calls_of_the_policy_built_by_hand(bundle, student):
    d = decoder.load_deployment(bundle)  # one pair: taken without naming it
    assert d.pair_id == "tiny" and d.config.tree == TREE and d.config.max_new_tokens == 24
    assert d.decision["deploys"] == "student:-0.50" and d.policy.threshold == pytest.approx(-1.04)
    assert d.runtime(30) == replace(d.runtime(30), prompt_tokens=30, target_ms=2.0, mid_ms=1.0)
    assert d.checksums_sha256 == sha256_of_file(bundle / "tiny" / CHECKSUMS_FILE)
    assert decoder.load_deployment(bundle, "tiny", expect_sha256=d.checksums_sha256).pair_id == "tiny"
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    hand, calls = by_hand(student, -0.5), set()
    for prompt in _prompts(3, seed=83):
        got = generate(pair, prompt, d.policy, d.config, d.runtime(len(prompt)))
        want = generate(pair, prompt, hand, d.config, d.runtime(len(prompt)))
        assert got.new_tokens == want.new_tokens == generate(pair, prompt, "ar", d.config).new_tokens
        mids = [tuple(s.used_mid for s in r.steps) for r in got.rounds]
        assert mids == [tuple(s.used_mid for s in r.steps) for r in want.rounds]
        calls |= {m for r in mids for m in r}
    assert calls == {True, False}, (
        "the policy never (or always) called the mid drafter: the test would not tell"
    )


def test_switch_off_wraps_the_deployed_policy_priced_with_the_bundles_profile(bundle, student):
    """for_deployment(d): the deployed student inside SwitchOff, its prices the bundle's profile; the
    tokens stay AR's, and a decode reports how its rounds ran."""
    d = decoder.load_deployment(bundle)
    wrapped = for_deployment(d)
    assert isinstance(wrapped, SwitchOff) and wrapped.inner.threshold == d.policy.threshold
    assert wrapped.pricer.ar_ms == d.profile.ar_token_ms == hand_profile().ar_token_ms
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    for prompt in _prompts(2, seed=84):
        got = generate(pair, prompt, wrapped, d.config, d.runtime(len(prompt)))
        assert got.new_tokens == generate(pair, prompt, "ar", d.config).new_tokens
        assert got.modes.verified + got.modes.as_ar == len(got.rounds) > 0
    assert for_deployment(replace(d, policy="ar")) == "ar"  # AR has nothing to switch off


def test_a_fallback_decodes_its_fixed_schedule(tmp_path, student):
    speedup = {"all-small": 1.2, "all-mid": 1.1, "student": 1.0}
    decision = {"deploys": "all-small", "threshold_offset": None, "threshold": None, "prompts": 6,
                "speedup": speedup, **checked("all-small")}  # fmt: skip
    write_pair_bundle(
        tmp_path / "b", record(student, decision), student.with_suffix(""), bundle_profile(student)
    )
    d = decoder.load_deployment(tmp_path / "b")  # a pair folder, no index
    assert d.policy == "all-small" and not d.is_learned
    # without a mid drafter, All-Small stays deployable; All-Mid is refused at load, not mid-decode
    no_mid = {"target": "t", "mid": None, "dtype": "float32", "device": "cpu", "linear": "stock",
              "template": "zoo"}  # fmt: skip
    write_pair_bundle(
        tmp_path / "c",
        record(student, decision, models=no_mid),
        student.with_suffix(""),
        bundle_profile(student),
    )
    with pytest.raises(decoder.DeploymentError, match="deploys all-mid, which calls a mid drafter"):
        write_pair_bundle(tmp_path / "d", record(student, {**decision, "deploys": "all-mid"}, models=no_mid),
                          student.with_suffix(""), bundle_profile(student))  # fmt: skip
    assert not (tmp_path / "d").exists()


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _reseal(root: Path) -> None:
    """Checksums and index recomputed after an edit: what someone hand-editing a bundle would do."""
    write_index(root, {"tiny": seal_folder(root / "tiny")})


def _edit_profile_record(root: Path, edit) -> None:
    """Edit profile.json and make deployment.json record the edited file's sha256 (a bundle whose
    records agree but whose profile is no longer one)."""
    _edit_json(root / "tiny" / "profile.json", edit)
    digest = sha256_of_file(root / "tiny" / "profile.json")
    _edit_json(root / "tiny" / DEPLOYMENT_FILE, lambda d: d["profile"].update(sha256=digest))


def _drop_runtime(d: dict) -> None:
    del d["runtime"]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


TAMPER = {
    "changed value": (
        lambda r: _edit_json(r / "tiny" / DEPLOYMENT_FILE, lambda d: d["runtime"].update(mid_ms=0.5)),
        False, r"tiny/deployment.json: sha256 differs from checksums.json",
    ),
    "removed field": (
        lambda r: _edit_json(r / "tiny" / DEPLOYMENT_FILE, _drop_runtime),
        True, r"tiny/deployment.json: field 'runtime': Field required",
    ),
    "value out of range": (
        lambda r: _edit_json(r / "tiny" / DEPLOYMENT_FILE, lambda d: d["tree"].update(budget=0)),
        True, r"tiny/deployment.json: field 'tree': TreeConfig.budget must be positive",
    ),
    "threshold not the offset's": (
        lambda r: _edit_json(r / "tiny" / DEPLOYMENT_FILE, lambda d: d["decision"].update(threshold=3.0)),
        True, r"decision.threshold 3.0 is not the student's threshold plus the offset",
    ),
    "truncated weights": (
        lambda r: _truncate(r / "tiny" / "scheduler.safetensors"),
        False, r"tiny/scheduler.safetensors: sha256 differs from checksums.json \(truncated or edited\)",
    ),
    "truncated weights, resealed": (
        lambda r: _truncate(r / "tiny" / "scheduler.safetensors"),
        True, r"tiny/scheduler.json: .*scheduler.safetensors",
    ),
    "wrong checksum": (
        lambda r: _edit_json(r / "tiny" / CHECKSUMS_FILE, lambda d: d.update({"scheduler.json": HEX})),
        False, r"tiny/checksums.json: sha256 [0-9a-f]{64} differs from index.json's entry",
    ),
    "missing file": (
        lambda r: (r / "tiny" / "scheduler.json").unlink(),
        False, r"tiny/scheduler.json: missing file \(listed in checksums.json\)",
    ),
    "extra file": (
        lambda r: (r / "tiny" / "notes.txt").write_text("x"),
        False, r"tiny/notes.txt: not covered by checksums.json",
    ),
    "profile edited, resealed": (
        lambda r: _edit_json(r / "tiny" / "profile.json", lambda d: d.update(ar_token_ms=1.0)),
        True, r"tiny/profile.json: not the latency profile deployment.json records",
    ),
    "profile not a profile, resealed": (
        lambda r: _edit_profile_record(r, lambda d: d.pop("ar_token_ms")),
        True, r"tiny/profile.json: not a latency profile \(.*missing key\(s\) \['ar_token_ms'\]",
    ),
    "missing index entry file": (
        lambda r: (r / "tiny" / CHECKSUMS_FILE).unlink(),
        False, r"tiny/checksums.json: missing file",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TAMPER))
def test_each_tampered_bundle_is_one_error_naming_the_file(bundle, case):
    tamper, reseal, message = TAMPER[case]
    tamper(bundle)
    if reseal:
        _reseal(bundle)
    with pytest.raises(decoder.DeploymentError, match=message) as err:
        decoder.load_deployment(bundle, "tiny")
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_files_swapped_after_their_check_are_not_what_loads(bundle, monkeypatch):
    """Every bundle file is read once: the bytes hashed are the bytes parsed. A deployment.json,
    profile and student swapped on disk right after the check (a race, or a hostile writer) change
    nothing that load_deployment returns."""
    want = decoder.load_deployment(bundle)
    real = decoder.deploy.deployment.verified_folder
    folder = bundle / "tiny"

    def then_swapped(*args, **kwargs):
        found = real(*args, **kwargs)
        _edit_json(folder / DEPLOYMENT_FILE, lambda d: d["decode"].update(max_new_tokens=7))
        _edit_json(folder / "profile.json", lambda d: d.update(ar_token_ms=123.0))
        (folder / "scheduler.json").write_text("not json")
        (folder / "scheduler.safetensors").write_bytes(b"")
        return found

    monkeypatch.setattr(decoder.deploy.deployment, "verified_folder", then_swapped)
    got = decoder.load_deployment(bundle)
    assert got.config == want.config and got.config.max_new_tokens == 24
    assert got.profile == want.profile and got.profile.ar_token_ms != 123.0
    assert got.policy.threshold == want.policy.threshold and got.record == want.record


def test_a_wrong_entry_in_a_pair_folder_without_index_names_the_file(bundle):
    _edit_json(bundle / "tiny" / CHECKSUMS_FILE, lambda d: d.update({"scheduler.json": HEX}))
    with pytest.raises(decoder.DeploymentError, match=r"tiny/scheduler.json: sha256 differs"):
        decoder.load_deployment(bundle / "tiny")


def test_pinned_digest_and_pair_choice(bundle, student, tmp_path):
    with pytest.raises(decoder.DeploymentError, match=r"differs from --expect-sha256 " + HEX):
        decoder.load_deployment(bundle, expect_sha256=HEX)
    with pytest.raises(decoder.DeploymentError, match="must be 64 lowercase hex digits"):
        decoder.load_deployment(bundle, expect_sha256="abc")
    with pytest.raises(decoder.DeploymentError, match=r"index.json: no pair 'nope'; it holds \['tiny'\]"):
        decoder.load_deployment(bundle, "nope")
    other = write_pair_bundle(bundle / "two", {**record(student, shifted(student, 0.0)), "pair_id": "two"},
                              student.with_suffix(""), bundle_profile(student))  # fmt: skip
    write_index(bundle, {"tiny": sha256_of_file(bundle / "tiny" / CHECKSUMS_FILE), "two": other})
    with pytest.raises(decoder.DeploymentError, match=r"holds pairs \['tiny', 'two'\]; name one \(--pair\)"):
        decoder.load_deployment(bundle)
    assert decoder.load_deployment(bundle, "two").decision["deploys"] == "student"
    with pytest.raises(decoder.DeploymentError, match="neither a bundle root"):
        decoder.load_deployment(tmp_path)
    assert not (bundle / INDEX_FILE).read_text().count(".tmp")


def test_a_bundle_that_fails_its_checks_is_not_written(tmp_path, student):
    bad = record(student, {**shifted(student, -0.5), "deploys": "student:9.00"})
    with pytest.raises(decoder.DeploymentError, match=r"field 'decision': deploys 'student:9\.00'"):
        write_pair_bundle(tmp_path / "b", bad, student.with_suffix(""), bundle_profile(student))
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b*"))


def test_the_stored_decision_is_what_pair_checks_computes(tmp_path, student, monkeypatch):
    """pair_checks on priced calibration cells (stubbed), then decision_of into the bundle: the loaded
    bundle deploys the check's choice at its offset, with the check's speedups, prompt count, paired
    margins and the adaptive rule's chosen thresholds."""
    students = deploy.threshold_variants(student, 5, 10, THRESHOLD_OFFSETS)
    ends = {"all-small": [100.0, 100.0], "all-mid": [80.0, 80.0]}
    by_pair = {  # p: a shifted threshold beats All-Mid; q: no threshold does (All-Mid deployed);
        # r: the budget stage's schedule beats them all (deployed by its bits)
        "p": {n: [70.0, 75.0] if n == "student:-0.50" else [85.0, 85.0] for n in students},
        "q": {n: [90.0, 90.0] for n in students},
        "r": {n: [90.0, 90.0] for n in students},
    }
    budget = {"p": [99.0, 99.0], "q": [99.0, 99.0], "r": [60.0, 66.0]}

    def stored(path, cells):  # evaluate_fixed's calibration cells: the endpoints, priced
        assert path.name == "calibration.json" and cells == [(p, d) for p in "pqr" for d in "ab"]
        return {c: f"part of {c}" for c in cells}, []

    def priced(params, cells, policies, fixed, progress, prompts, hindsight, parts):
        assert prompts == (6, 6) and fixed == {} and not hindsight
        assert parts == {c: f"part of {c}" for c in cells}  # the students merged into the stored parts
        assert set(policies) == {*students, *(t.name for t in GRID)}  # and every adaptive variant
        rules = {t.name: [95.0, 95.0] if t.name == "adaptive:0:4" else [100.0, 100.0] for t in GRID}
        out = {(p, d): _cell_of([200.0, 200.0], **by_pair[p], **ends, **rules) for p, d in cells}
        for (p, _), cell in out.items():  # the budget stage's schedule, priced under its name
            cell.methods["budget"] = PricedMethod(
                "budget", "10000", np.asarray(budget[p]), np.ones(2), 1.0, ()
            )
        return out

    monkeypatch.setattr(deploy, "read_fixed", stored)
    monkeypatch.setattr(deploy, "priced_cells", priced)
    params = SimpleNamespace(
        evaluate=SimpleNamespace(pairs=["p", "q", "r"], datasets=["a", "b", "c"], held_out_datasets=["c"],
                                 prompt_start=40, out_dir="artifacts/evaluate"),
        collect=SimpleNamespace(prompt_start=0, prompts_per_report=6),
    )  # fmt: skip
    checks = deploy.pair_checks(params, students)
    assert checks["p"]["deploys"] == "student:-0.50" and checks["q"]["deploys"] == "all-mid"
    assert checks["r"]["deploys"] == "10000" and checks["r"]["margin"][1] > 1.0
    for pair_id, check in checks.items():
        decision = deploy.decision_of(check, students)
        write_pair_bundle(tmp_path / pair_id, {**record(student, decision), "pair_id": pair_id},
                          student.with_suffix(""), bundle_profile(student))  # fmt: skip
        d = decoder.load_deployment(tmp_path / pair_id)
        assert {k: d.decision[k] for k in check if k != "adaptive"} == {
            k: v for k, v in check.items() if k != "adaptive"
        }
        assert d.adaptive.name == check["adaptive"]["chosen"] == "adaptive:0:4"  # 5% faster on every prompt
        if d.is_learned:
            assert d.decision["threshold_offset"] == -0.5
            assert d.policy.threshold == students[check["deploys"]].threshold
        else:
            assert d.policy == check["deploys"] and d.decision["threshold_offset"] is None


def test_a_fixed_schedule_is_deployed_by_its_bits_and_read_back_as_its_row():
    """A bundle deploying the budget stage's schedule names its bits (the endpoints by name), the
    record takes bits as a fallback and nothing else that looks like one, and evaluate finds the
    row a bundle names: the method itself, or for bits the budget stage's row rather than the
    hindsight one that may hold the same schedule."""
    assert [policy_name_of(b) for b in ("00000", "11111", "10000")] == [
        "all-small",
        "all-mid",
        "10000",
    ]
    assert is_fallback("10000") and is_fallback("all-mid") and is_fallback("ar")
    assert not is_fallback("student:-0.50") and not is_fallback("") and not is_fallback("1020")
    methods = {
        n: SimpleNamespace(schedule=s)
        for n, s in [("all-small", "00000"), ("best-fixed", "10000"), ("budget", "10000"), ("student", None)]
    }
    cell = SimpleNamespace(methods=methods)
    assert method_of(cell, "student") == "student" and method_of(cell, "10000") == "budget"
    with pytest.raises(ValueError, match="'01000'"):
        method_of(cell, "01000")
