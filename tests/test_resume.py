"""Resume of the collect stage: SIGKILL mid-write, param and model changes, corrupt files, fsync.

A finished report is reused only when everything that shapes it is unchanged (its manifest's key);
anything else is recollected with a warning naming the file, and the merged tables then equal those
of an uninterrupted run in another folder, byte for byte.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from collect_workspace import (
    build_workspace,
    collect_overrides,
    merged_bytes,
    params_for,
    report_stamps,
    run_collect,
    spy_reports,
)

from collectors.collect.plan import plan_reports, report_inputs
from collectors.collect.report import MANIFEST, TABLE_NAMES, read_report, write_report
from config.params import ROOT, Params, deep_merge, load_params
from features.tables import TableSpec, write_table
from pipeline.cli import stage_params

FIRST, SECOND = "tiny__code__0-2", "tiny__chat__0-2"  # plan order: datasets [code, chat]

# The collect stage in a process of its own, on a slow disk: every table write waits first, so the
# test can SIGKILL it while the second report's temporary folder is half-written.
KILLED_RUN = """
import json, sys, time
from collectors.collect import report
from config.params import load_params
from pipeline import collect
from pipeline.cli import stage_params

real_write = report.write_table

def slow_write(path, spec, table):
    time.sleep(0.3)
    real_write(path, spec, table)

report.write_table = slow_write
collect.main(stage_params("collect", load_params(profile="smoke", overrides=json.loads(sys.argv[1]))))
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("resume"))


@pytest.fixture(scope="module")
def reference(workspace) -> Params:
    """An uninterrupted run in its own folder."""
    params = params_for(workspace, name="reference")
    run_collect(params)
    return params


def reports_of(params: Params) -> Path:
    return Path(params.collect.out_dir) / "reports"


def copy_reports(src: Params, dst: Params) -> Path:
    """Start ``dst`` from ``src``'s finished reports (manifests hold no paths, so they stay valid)."""
    shutil.copytree(reports_of(src), reports_of(dst))
    return reports_of(dst)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_sigkill_mid_write_then_rerun_matches_an_uninterrupted_run(workspace, reference, monkeypatch):
    params = params_for(workspace, name="killed")
    reports = reports_of(params)
    overrides = json.dumps(collect_overrides(workspace, name="killed"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (workspace / "killed.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, overrides], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 240
    try:
        while not ((reports / FIRST / MANIFEST).is_file() and list(reports.glob(".tmp-*"))):
            assert proc.poll() is None, (workspace / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the second report's write never started"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    (half,) = reports.glob(".tmp-*")
    assert half.name == f".tmp-{proc.pid}-{SECOND}" and not (reports / SECOND).exists()
    assert not (Path(params.collect.out_dir) / "trajectories.parquet").exists()
    stamps = report_stamps(params)
    calls = spy_reports(monkeypatch)
    run_collect(params)
    assert calls == [SECOND]  # the finished report is reused, the half-written one recollected
    assert {p: t for p, t in report_stamps(params).items() if p.parent.name == FIRST} == stamps
    assert sorted(p.name for p in reports.iterdir()) == sorted([FIRST, SECOND])  # the leftover is gone
    assert merged_bytes(params) == merged_bytes(reference)


def test_param_change_recollects_every_report_with_a_warning(workspace, reference, monkeypatch, caplog):
    params = params_for(workspace, name="changed", max_new_tokens=8)
    reports = copy_reports(reference, params)
    calls = spy_reports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="collectors.collect.report"):
        run_collect(params)
    assert calls == [FIRST, SECOND]
    warnings = warnings_of(caplog)
    for report_id, warning in zip([FIRST, SECOND], warnings, strict=True):
        assert str(reports / report_id / MANIFEST) in warning and "collect.max_new_tokens: 12 -> 8" in warning
    fresh = params_for(workspace, name="fresh", max_new_tokens=8)
    run_collect(fresh)
    assert merged_bytes(params) == merged_bytes(fresh) != merged_bytes(reference)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a parquet file at all")


def _flip_a_byte(path: Path) -> None:  # still a readable Parquet file: only the digest can tell
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _bad_json(path: Path) -> None:
    path.write_text('{"report_id": "tiny__chat__0-2", "key": ')


@pytest.mark.parametrize(
    ("file", "corrupt"),
    [
        ("rounds.parquet", _truncate),
        ("actions.parquet", _garbage),
        ("trajectories.parquet", _flip_a_byte),
        (MANIFEST, _bad_json),
        ("rounds.parquet", Path.unlink),
    ],
    ids=["truncated", "garbage", "flipped-byte", "bad-manifest-json", "missing-table"],
)
def test_corrupt_report_is_recollected_with_a_warning_naming_the_file(
    workspace, reference, monkeypatch, caplog, file, corrupt
):
    params = params_for(workspace, name=f"corrupt-{corrupt.__name__}-{file}")
    reports = copy_reports(reference, params)
    corrupt(reports / SECOND / file)
    untouched = {p: t for p, t in report_stamps(params).items() if p.parent.name == FIRST}
    calls = spy_reports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="collectors.collect.report"):
        run_collect(params)
    assert calls == [SECOND]
    (warning,) = warnings_of(caplog)
    assert str(reports / SECOND / file) in warning
    assert {p: t for p, t in report_stamps(params).items() if p.parent.name == FIRST} == untouched
    assert merged_bytes(params) == merged_bytes(reference)


def test_every_input_that_shapes_a_report_changes_its_key(workspace, tmp_path):
    def inputs(**changes) -> dict:
        overrides = deep_merge(collect_overrides(workspace, **changes.pop("collect", {})), changes)
        params = stage_params("collect", load_params(profile="smoke", overrides=overrides))
        return report_inputs(params, plan_reports(params).reports[0])

    base = inputs()

    def changed(**changes) -> list[str]:
        new = inputs(**changes)
        assert set(new) == set(base)
        return sorted(k for k in base if base[k] != new[k])

    assert changed(collect={"name": "elsewhere", "backend": "ray", "datasets": ["code"]}) == []
    for key, value in [("max_new_tokens", 8), ("max_prompt_tokens", 32), ("mode", "execute"),
                       ("seed", 7), ("round_table_stride", 3)]:  # fmt: skip
        assert changed(collect={key: value}) == [f"collect.{key}"]
    assert changed(tree={"width": 7}) == ["tree.width"]
    assert changed(tree={"grafting": "overwrite"}) == ["tree.grafting"]

    pair = tmp_path / "pair"
    shutil.copytree(workspace / "pair", pair)
    moved = {"pairs": {"tiny": {"target": str(pair / "target"), "mid": str(pair / "mid")}}}
    assert changed(**moved) == []  # a model is its content, not its path
    config = pair / "mid" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "rms_norm_eps": 1e-5}))
    assert changed(**moved) == ["mid"]
    (pair / "target" / "model.safetensors").write_bytes(b"other weights")
    assert changed(**moved) == ["mid", "target"]

    profile = tmp_path / "profile"
    shutil.copytree(workspace / "profile", profile)
    assert changed(profile={"out_dir": str(profile)}) == []
    raw = json.loads((profile / "tiny.json").read_text())
    raw["ngram_step_ms"] += 1.0
    (profile / "tiny.json").write_text(json.dumps(raw))
    assert changed(profile={"out_dir": str(profile)}) == ["profile"]

    data = tmp_path / "data"
    shutil.copytree(workspace / "data", data)
    questions = data / "code" / "question.jsonl"
    questions.write_text(questions.read_text().replace("Explain", "Describe", 1))
    assert changed(data={"out_dir": str(data)}) == ["prompts"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names fsynced files through /proc")
def test_writes_fsync_file_and_folder_around_the_rename(reference, tmp_path, monkeypatch):
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    root = Path(os.path.realpath(tmp_path))
    spec = TableSpec("t", "v1", (("x", pa.int64()),))
    write_table(root / "t.parquet", spec, pa.table({"x": [1, 2]}, schema=spec.schema))
    tmp = str(root / f".t.parquet.tmp-{os.getpid()}")
    assert events == [("fsync", tmp), ("replace", tmp, str(root / "t.parquet")), ("fsync", str(root))]

    events.clear()
    params = stage_params("collect", reference)
    plan = plan_reports(params)
    spec_ = plan.reports[0]
    tables = read_report(plan.reports_dir / spec_.report_id, params.tree.depth, plan.inputs[spec_.report_id])
    out = root / "reports"
    final = write_report(out, spec_, tables, params.tree.depth, plan.inputs[spec_.report_id])
    staging = str(out / f".tmp-{os.getpid()}-{spec_.report_id}")
    rename = events.index(("replace", staging, str(final)))
    synced_before = {e[1] for e in events[:rename] if e[0] == "fsync"}
    tables_synced = {f"{staging}/.{n}.parquet.tmp-{os.getpid()}" for n in TABLE_NAMES}
    assert tables_synced | {f"{staging}/{MANIFEST}", staging} <= synced_before
    assert events[rename + 1 :] == [("fsync", str(out))]
    assert read_report(final, params.tree.depth, plan.inputs[spec_.report_id]).rounds.equals(tables.rounds)
