"""Collectors: replay equals execute, the collect stage end to end, resume, bad input, Ray."""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path

import pytest
from conftest import noisy_copy, save_pair, tiny_model, train_tokenizer

from collectors.execute import execute_prompt
from collectors.replay import Replayer
from config.params import load_params
from decoder.config import DecodeConfig
from decoder.models import make_pair
from decoder.policies import schedule_bits
from features.tables import SchemaError
from pipeline import collect
from pipeline.cli import stage_params

SCHEDULES = [schedule_bits(s, 5) for s in range(32)]


def repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(1, 96) for _ in range(rng.randrange(5, 20))]
        out.append([*(base * 3)[: rng.randrange(10, 50)], rng.randrange(1, 96)])
    return out


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_replay_equals_execute_exactly(arch):
    target = tiny_model(arch, seed=51)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=52), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    replayer = Replayer(pair, config, SCHEDULES)
    for prompt in repetitive_prompts(2, seed=53):
        rep = replayer.replay_prompt(prompt)
        assert set(rep.starts) and all(len(v) == 32 for v in rep.starts.values())
        for s, bits in enumerate(SCHEDULES):
            rounds, n = execute_prompt(pair, prompt, bits, config)
            assert [r.accepted for r in rounds] == [r.accepted for r in rep.rounds[s]], bits
            assert n == rep.n_tokens[s]
            for a, b in zip(rounds, rep.rounds[s], strict=True):
                assert (a.verified_nodes, a.mid_call_tokens, a.small_steps, a.emitted) == (
                    b.verified_nodes, b.mid_call_tokens, b.small_steps, b.emitted,
                )  # fmt: skip
                flat = [x for step in b.signals for x in step]
                assert [x for step in a.signals for x in step] == pytest.approx(flat, rel=1e-5, abs=1e-6)


QUESTIONS = [
    "Explain what this function does and how to test it.",
    "Summarize the module below in two sentences.",
    "Write a docstring for the following class.",
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Question files, a saved pair with a trained tokenizer and its latency profile."""
    root = tmp_path_factory.mktemp("collect")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:25]]
    for d, name in enumerate(["code", "chat"]):
        lines = [
            json.dumps({"question_id": i, "category": name, "turns": [q + "\n" + texts[d * 3 + i][:300]]})
            for i, q in enumerate(QUESTIONS)
        ]
        (root / "data" / name).mkdir(parents=True)
        (root / "data" / name / "question.jsonl").write_text("\n".join(lines) + "\n")
    save_pair(root / "pair", train_tokenizer(texts, vocab=300), seed=61)
    from pipeline.profile import main as profile_main

    profile_main(stage_params("profile", params_for(root)))
    return root


def run_collect(params):
    """The collect stage as DVC runs it: only the params its dvc.yaml entry lists are readable."""
    return collect.main(stage_params("collect", params))


def params_for(root: Path, **collect):
    return load_params(
        profile="smoke",
        overrides={
            "data": {"out_dir": str(root / "data")},
            "pairs": {"tiny": {"target": str(root / "pair/target"), "mid": str(root / "pair/mid"),
                               "dtype": "float32", "device": "cpu", "template": "zoo"}},
            "profile": {"pairs": ["tiny"], "out_dir": str(root / "profile"), "sizes": [1, 16, 64, 160]},
            "collect": {"out_dir": str(root / collect.pop("name", "out")), "pairs": ["tiny"],
                        "datasets": ["code", "chat"], "prompts_per_report": 2, "max_new_tokens": 12,
                        **collect},
        },
    )  # fmt: skip


def test_collect_stage_rows_summary_and_second_run_resumes(workspace):
    params = params_for(workspace)
    metrics = run_collect(params)
    out = Path(params.collect.out_dir)
    from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
    from features.tables import read_table

    traj = read_table(out / "trajectories.parquet", TRAJECTORIES)
    actions = read_table(out / "actions.parquet", actions_spec(5))
    rounds = read_table(out / "rounds.parquet", rounds_spec(5))
    assert traj.num_rows == 2 * 32 and actions.num_rows == 2 * 32 * 5
    assert rounds.num_rows % 32 == 0 and rounds.num_rows > 0
    assert sorted(set(traj.column("schedule_id").to_pylist())) == list(range(32))
    assert sum(rounds.column("is_round_best").to_pylist()) == rounds.num_rows // 32
    assert metrics["n_reports"] == 2 and (out / "summary.md").read_text().count("| tiny__") == 2
    stamps = {p: p.stat().st_mtime_ns for p in (out / "reports").rglob("*.parquet")}
    run_collect(params)
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "reports").rglob("*.parquet")}


def test_interrupted_run_resumes_at_the_first_missing_report(workspace, monkeypatch):
    params = params_for(workspace, name="interrupted")
    real = collect.run_report
    calls = []

    def flaky(params, spec, reports_dir, progress=True):
        calls.append(spec.report_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(params, spec, reports_dir, progress)

    monkeypatch.setattr(collect, "run_report", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_collect(params)
    reports = Path(params.collect.out_dir) / "reports"
    assert [p.name for p in reports.iterdir()] == [calls[0]]  # one complete report, nothing half-written
    calls.clear()
    run_collect(params)
    assert (len(calls) == 1 and calls[0] != sorted(p.name for p in reports.iterdir())[0]) or len(calls) == 1
    assert len(list(reports.iterdir())) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pairs": ["nope"]}, "unknown pair"),
        ({"datasets": ["code", "missing"]}, "unknown dataset"),
        ({"backend": "spark"}, "backend must be one of"),
    ],
)
def test_bad_names_fail_before_any_work(workspace, change, message):
    params = params_for(workspace, name="bad", **change)
    with pytest.raises(ValueError, match=message):
        run_collect(params)
    assert not (Path(params.collect.out_dir) / "reports").exists()


def test_unsupported_depth(workspace):
    overrides = {"tree": {"depth": 9}, "data": {"out_dir": str(workspace / "data")},
                 "collect": {"datasets": ["code"], "pairs": ["zoo-s"]}}  # fmt: skip
    params = load_params(profile="smoke", overrides=overrides)
    with pytest.raises(ValueError, match="depth D=9 is not supported"):
        run_collect(params)


def test_output_folder_of_another_schema_version_is_refused_untouched(workspace):
    params = params_for(workspace, name="old")
    old = Path(params.collect.out_dir) / "reports" / "tiny__code__0-2"
    old.mkdir(parents=True)
    manifest = old / "manifest.json"
    manifest.write_text(json.dumps({"report_id": old.name, "schemas": {"trajectories": "trajectories/v0"}}))
    before = manifest.read_bytes()
    with pytest.raises(SchemaError, match="this run writes"):
        run_collect(params)
    assert manifest.read_bytes() == before and sorted(p.name for p in old.iterdir()) == ["manifest.json"]


def test_ray_backend_matches_local(workspace):
    pytest.importorskip("ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    local = params_for(workspace, name="local-ray-ref")
    remote = params_for(workspace, name="ray", backend="ray")
    run_collect(local)
    run_collect(remote)
    from features.collect_schemas import TRAJECTORIES
    from features.tables import read_table

    a = read_table(Path(local.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    b = read_table(Path(remote.collect.out_dir) / "trajectories.parquet", TRAJECTORIES)
    assert a.column("mean_accepted_length").to_pylist() == b.column("mean_accepted_length").to_pylist()
    assert a.column("verified_nodes").to_pylist() == b.column("verified_nodes").to_pylist()


def test_round_table_stride_changes_only_the_round_table():
    target = tiny_model("qwen3", seed=71)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=72), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    prompt = repetitive_prompts(1, seed=73)[0]
    every = Replayer(pair, config, SCHEDULES, round_table_stride=1).replay_prompt(prompt)
    none = Replayer(pair, config, SCHEDULES, round_table_stride=0).replay_prompt(prompt)
    assert len(every.starts) > 1 and none.starts == {}
    for s in range(32):
        assert [(r.accepted, r.verified_nodes, r.mid_call_tokens) for r in every.rounds[s]] == [
            (r.accepted, r.verified_nodes, r.mid_call_tokens) for r in none.rounds[s]
        ]
