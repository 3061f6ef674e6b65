"""Collectors: replay equals execute, the collect stage end to end, resume, bad input, Ray.

Kill, corrupt-file and param-change resume cases: tests/test_resume.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from collect_workspace import (
    build_workspace,
    merged_bytes,
    params_for,
    report_stamps,
    run_collect,
    spy_reports,
)
from conftest import noisy_copy, repeated_prompts, tiny_model
from test_latency import linear_profile

from collectors.collect import plan as plan_module
from collectors.collect import replay, report
from collectors.collect.execute import execute_prompt
from collectors.collect.plan import plan_reports
from collectors.collect.replay import Replayer, continuation_decoding
from collectors.collect.report import inputs_key
from config.params import Params, load_params
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.policies import schedule_bits
from decoder.models.pair import make_pair
from pipeline.cli import stage_params

SCHEDULES = [schedule_bits(s, 5) for s in range(32)]


def repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    return repeated_prompts(n, seed, base=(5, 20), cut=(10, 50))


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
                assert (a.verified_nodes, a.mid_call_tokens, a.small_steps, a.emitted, a.mid_lag) == (
                    b.verified_nodes, b.mid_call_tokens, b.small_steps, b.emitted, b.mid_lag,
                )  # fmt: skip
                flat = [x for step in b.signals for x in step]
                assert [x for step in a.signals for x in step] == pytest.approx(flat, rel=1e-5, abs=1e-6)


def test_the_continuation_is_decoded_by_the_cheaper_lossless_decoder_and_is_the_same_text(monkeypatch):
    target = tiny_model("qwen3", seed=51)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=52), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    tree = config.tree
    # linear_profile: 5 one-token mid calls (6.25 ms) cost more than a root verify (2.5 ms); x40 less
    cheap_mid = linear_profile(verify_points=tuple((n, 100 + n) for n in (1, 2, 4, 8, 64)))
    cascade = ("all-mid", replace(tree, sequential=True))
    assert continuation_decoding(pair, cheap_mid, tree) == cascade
    assert continuation_decoding(pair, linear_profile(), tree) == ("all-small", tree)
    assert continuation_decoding(pair, None, tree) == ("all-small", tree)
    no_mid = make_pair(target, eos_token_ids=(0,))
    assert continuation_decoding(no_mid, cheap_mid, tree) == ("all-small", tree)
    used = []
    real = replay.generate

    def spy(p, prompt, policy, run, **kw):
        used.append((policy, run.tree))
        return real(p, prompt, policy, run, **kw)

    monkeypatch.setattr(replay, "generate", spy)
    plain, fast = Replayer(pair, config, SCHEDULES), Replayer(pair, config, SCHEDULES, profile=cheap_mid)
    for prompt in repetitive_prompts(3, seed=54):
        assert fast.continuation(prompt) == plain.continuation(prompt)
    assert used == [cascade, ("all-small", tree)] * 3


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("collect"))


@pytest.fixture(scope="module")
def finished(workspace) -> tuple[Params, dict]:
    """One uninterrupted collect run (the reference the resume tests compare with)."""
    params = params_for(workspace)
    return params, run_collect(params)


def test_collect_stage_rows_summary_and_second_run_resumes(finished):
    params, metrics = finished
    out = Path(params.collect.out_dir)
    from features.collect_schemas import CONTINUATIONS, TRAJECTORIES, actions_spec, rounds_spec
    from features.tables import read_table

    traj = read_table(out / "trajectories.parquet", TRAJECTORIES)
    actions = read_table(out / "actions.parquet", actions_spec(5))
    rounds = read_table(out / "rounds.parquet", rounds_spec(5))
    assert traj.num_rows == 2 * 32 and actions.num_rows == 2 * 32 * 5
    assert rounds.num_rows % 32 == 0 and rounds.num_rows > 0
    assert sorted(set(traj.column("schedule_id").to_pylist())) == list(range(32))
    assert sum(rounds.column("is_round_best").to_pylist()) == rounds.num_rows // 32
    import polars as pl

    firsts = (
        pl.from_arrow(rounds.select(["report_id", "prompt_id", "prompt_tokens", "start_position", "mid_lag"]))
        .sort("start_position")
        .group_by("report_id", "prompt_id")
        .first()
    )
    # a prompt's first round starts after the prompt and the token its prefill yields, with nothing
    # in the mid drafter's cache yet
    assert (firsts["start_position"] == firsts["prompt_tokens"] + 1).all()
    assert (firsts["mid_lag"] == firsts["prompt_tokens"]).all()
    assert metrics["n_reports"] == 2 and (out / "summary.md").read_text().count("| tiny__") == 2
    # each prompt's g: the target's own greedy tokens (past EOS), its stop at the first EOS within
    # max_new_tokens; what evaluate_graft's budget choice reads in place of a batched decode
    from collectors.collect.batch_greedy import greedy_batch
    from collectors.collect.plan import load_registered_pair, plan_reports, report_prompts
    from collectors.collect.report import prompt_digest, read_continuations

    pair = load_registered_pair(params, "tiny")
    collected = read_continuations(out / "continuations.parquet")
    stops = read_table(out / "continuations.parquet", CONTINUATIONS).column("stop").to_pylist()
    assert len(collected) == len(stops) == 2 * params.collect.prompts_per_report
    n = params.collect.max_new_tokens
    for spec in plan_reports(params).reports:
        prompts = report_prompts(params, spec, pair.tokenizer)
        for prompt, g in zip(prompts, greedy_batch(pair.target, prompts, n, pair.vocab_size), strict=True):
            stored = collected["tiny", prompt_digest(prompt)]
            assert len(stored) > n and stored[:n] == g
    assert all(1 <= s <= n for s in stops)
    stamps = report_stamps(params)
    before = merged_bytes(params)
    run_collect(params)
    assert stamps == report_stamps(params) and merged_bytes(params) == before


def test_interrupt_between_reports_resumes_with_only_the_unfinished_one(workspace, finished, monkeypatch):
    params = params_for(workspace, name="interrupted")
    first, second = [s.report_id for s in plan_reports(stage_params("collect", params)).reports]
    real_write = report.write_table
    written: list[Path] = []

    def dying_write(path, spec, table):
        if len(written) == len(report.TABLE_NAMES) + 1:  # the first report in place, the second begun
            raise KeyboardInterrupt
        real_write(path, spec, table)
        written.append(path)

    monkeypatch.setattr(report, "write_table", dying_write)
    with pytest.raises(KeyboardInterrupt):
        run_collect(params)
    monkeypatch.undo()
    reports = Path(params.collect.out_dir) / "reports"
    assert {p.parent.name for p in written} == {f".tmp-{os.getpid()}-{first}", f".tmp-{os.getpid()}-{second}"}
    assert [p.name for p in reports.iterdir()] == [first]  # nothing half-written is left
    stamps = report_stamps(params)
    calls = spy_reports(monkeypatch)
    run_collect(params)
    assert calls == [second]
    assert {p: t for p, t in report_stamps(params).items() if p.parent.name == first} == stamps
    assert merged_bytes(params) == merged_bytes(finished[0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pairs": ["nope"]}, "unknown pair"),
        ({"datasets": ["code", "missing"]}, "unknown dataset"),
        (
            {"backend": "spark"},
            r"collect\.backend: Input should be 'local' or 'ray'",
        ),  # refused when params load
    ],
)
def test_bad_names_fail_before_any_work(workspace, change, message):
    out_dir = Path(params_for(workspace, name="bad").collect.out_dir)
    with pytest.raises(ValueError, match=message):
        run_collect(params_for(workspace, name="bad", **change))
    assert not (out_dir / "reports").exists()


def test_a_pair_grown_at_another_width_than_the_students_is_refused_before_any_work(workspace, monkeypatch):
    """The budget stage's shape for a pair at W = 2 where tree.width is 10: the student's signals
    would be declared for another width than they were collected at, which deploy would refuse."""
    params = params_for(workspace, name="narrow")
    monkeypatch.setattr(plan_module, "pair_tree", lambda p, pair: replace(TreeConfig(), width=2))
    with pytest.raises(ValueError, match=r"gives \{'tiny': 2\} a tree width other than tree.width = 10"):
        run_collect(params)
    assert not (Path(params.collect.out_dir) / "reports").exists()


def test_unsupported_depth(workspace):
    overrides = {"tree": {"depth": 9}, "data": {"out_dir": str(workspace / "data")},
                 "collect": {"datasets": ["code"], "pairs": ["zoo-s"]}}  # fmt: skip
    params = load_params(profile="smoke", overrides=overrides)
    with pytest.raises(ValueError, match="depth D=9 is not supported"):
        run_collect(params)


def test_report_of_another_schema_version_is_recollected_with_a_warning(
    workspace, finished, monkeypatch, caplog
):
    params = params_for(workspace, name="old")
    reports = Path(params.collect.out_dir) / "reports"
    shutil.copytree(Path(finished[0].collect.out_dir) / "reports", reports)
    manifest = reports / "tiny__code__0-2" / "manifest.json"
    old = json.loads(manifest.read_text())
    old["inputs"]["schema.trajectories"] = "trajectories/v0"
    old["key"] = inputs_key(old["inputs"])
    manifest.write_text(json.dumps(old))
    calls = spy_reports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="collectors.collect.report"):
        run_collect(params)
    assert calls == ["tiny__code__0-2"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(manifest) in warning and "schema.trajectories: 'trajectories/v0' -> 'trajectories/" in warning
    assert json.loads(manifest.read_text())["key"] != old["key"]
    assert merged_bytes(params) == merged_bytes(finished[0])


@pytest.mark.slow  # starts a local Ray instance and its worker processes
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
