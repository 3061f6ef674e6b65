"""Bring your own pair: one pair, its own prompts file, a template from its tokenizer.

The tests run the learning stages on synthetic collectors' tables of ONE pair (the smoke profile;
all six stages in a ``slow`` test), and the data stage on a user's Spec-Bench ``question.jsonl``.
The ``slow`` walkthrough does what the README's walkthrough says, as a new user would: two
smoke-zoo checkpoints copied under new names, a 12-prompt question file, an overlay declaring the
pair, ``dvc exp run -S overlay=...``, then a decode with the bundle through the CLI.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from conftest import train_tokenizer
from synthetic_collect import synthetic_tables
from synthetic_rounds import synthetic_rounds

from collectors.data.prompts import PromptFileError, encode_prompts, load_questions, split_by_category
from config.model_paths import ModelNotLocalError, resolve_model
from config.params import ROOT, Params, ParamsError, deep_merge, load_params
from decoder.models.templates import jinja_chat_template, render, render_prompt
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.tables import write_table
from pipeline.cli import stage_params

LEARNING = ("canonicalize", "select_signals", "fit_value", "margins", "distill", "export")
PAIR = "my-pair"
CATEGORIES = ("coding", "writing")


def _one_pair(table: pa.Table, datasets: dict[str, str]) -> pa.Table:
    """Every report relabelled to one pair; each report keeps a dataset of its own."""
    reports = table.column("report_id").to_pylist()
    pair = pa.array([PAIR] * len(reports), pa.string())
    dataset = pa.array([datasets[r] for r in reports], pa.string())
    table = table.set_column(table.schema.get_field_index("pair_id"), "pair_id", pair)
    return table.set_column(table.schema.get_field_index("dataset_id"), "dataset_id", dataset)


def _write_one_pair_collect(out: Path, n_reports: int, depth: int) -> None:
    actions, trajectories = synthetic_tables(n_reports, depth, seed=3, planted="tree_size")
    ids = sorted(set(actions.column("report_id").to_pylist()))
    datasets = {r: f"cat{i}" for i, r in enumerate(ids)}
    actions, trajectories = _one_pair(actions, datasets), _one_pair(trajectories, datasets)
    write_table(out / "actions.parquet", actions_spec(depth), actions)
    write_table(out / "trajectories.parquet", TRAJECTORIES, trajectories)
    rounds = synthetic_rounds(actions, trajectories, depth, 3)
    write_table(out / "rounds.parquet", rounds_spec(depth), rounds)


def _learning_params(root: Path) -> Params:
    overrides = {"collect": {"out_dir": str(root / "collect")}, "mlflow": {"db": str(root / "mlflow.db")}}
    overrides |= {s: {"out_dir": str(root / s)} for s in LEARNING}
    fast = {"distill": {"train": {"epochs": 5}}}
    return load_params(profile="smoke", overrides=deep_merge(overrides, fast))


@pytest.mark.slow
def test_learning_stages_run_on_one_pair_without_the_leave_pair_out_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One pair with 3 datasets: every learning stage runs; the leave-one-pair-out split and
    student are skipped with a logged note; report folds are the pair's datasets."""
    n_reports = 3
    params = _learning_params(tmp_path)
    _write_one_pair_collect(tmp_path / "collect", n_reports, params.tree.depth)
    caplog.set_level(logging.INFO)
    results = {s: importlib.import_module(f"pipeline.{s}").main(stage_params(s, params)) for s in LEARNING}
    canon = results["canonicalize"]
    assert canon["n_reports"] == n_reports and canon["n_folds"] == n_reports
    assert canon["n_pair_folds"] == 0
    assert all(row["pair_fold"] is None for row in canon["folds"].values())
    signals = json.loads((tmp_path / "select_signals" / "signals.json").read_text())
    assert set(signals["by_fold"]) == {"report"} and len(signals["by_fold"]["report"]) == n_reports
    assert "student_lopo" not in results["distill"]["offline"]
    assert any("no leave-one-pair-out split" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "export" / "scheduler.json").is_file()


def test_one_pair_with_two_datasets_fails_naming_the_fix(tmp_path: Path) -> None:
    """Two reports leave no inner fold to train on: canonicalize says so before writing anything."""
    params = _learning_params(tmp_path)
    _write_one_pair_collect(tmp_path / "collect", 2, params.tree.depth)
    canonicalize = importlib.import_module("pipeline.canonicalize")
    with pytest.raises(ValueError, match=r"at least 3 reports .* at least 3 categories"):
        canonicalize.main(stage_params("canonicalize", params))
    assert not (tmp_path / "canonicalize" / "states.parquet").exists()


def spec_bench_lines(n_per_category: int = 4) -> list[str]:
    """A 12-prompt question.jsonl in Spec-Bench's format: 3 categories, interleaved."""
    lines = []
    for i in range(n_per_category):
        for c, category in enumerate(CATEGORIES):
            qid = f"q{i * len(CATEGORIES) + c}"
            turn = f"Question {i} about {category}: explain the idea in two sentences."
            lines.append(json.dumps({"question_id": qid, "category": category, "turns": [turn]}))
    return lines


CATEGORIES = ("coding", "writing", "math")


def test_a_user_question_file_splits_into_one_dataset_per_category(tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(spec_bench_lines()) + "\n", encoding="utf-8")
    groups = split_by_category(path, reserved={"alpaca", "corpus"})
    assert list(groups) == list(CATEGORIES)
    assert all(len(qs) == 4 and {q.dataset for q in qs} == {name} for name, qs in groups.items())
    assert [q.question_id for q in groups["math"]] == ["q2", "q5", "q8", "q11"]  # file order kept


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question_id": 7, "category": "x", "turns": ["a"]', "invalid JSON"),
        ('{"question_id": 7, "turns": ["a"]}', "missing key(s) ['category']"),
        ('{"question_id": 7, "category": "x", "turns": []}', "turns must be a non-empty list"),
        ('{"question_id": "q0", "category": "x", "turns": ["a"]}', "duplicate question_id 'q0'"),
        ('{"question_id": 7, "category": "alpaca", "turns": ["a"]}', "taken by a built-in dataset"),
        ('{"question_id": 7, "category": "my tasks", "turns": ["a"]}', "names the dataset's folder"),
    ],
)
def test_a_bad_user_question_file_fails_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join([*spec_bench_lines()[:3], line]) + "\n", encoding="utf-8")
    with pytest.raises(PromptFileError) as err:
        split_by_category(path, reserved={"alpaca", "corpus"})
    assert str(err.value).startswith(f"{path}:4: ") and message in str(err.value)


def test_questions_must_sit_under_the_prompts_folder_dvc_tracks() -> None:
    assert load_params(profile="my-pair").data.questions == "prompts/my_prompts.jsonl"
    with pytest.raises(ParamsError, match=r"params\.data\.questions: String should match pattern"):
        load_params(profile="smoke", overrides={"data": {"questions": "artifacts/data/q.jsonl"}})
    shipped = load_questions(ROOT / load_params(profile="my-pair").data.questions)
    assert len(shipped) == 12 and len({q.category for q in shipped}) == 3


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["Explain the idea in two sentences. " * 20, "def f(x): return x"], vocab=200)


def test_template_auto_renders_what_the_tokenizer_carries(tokenizer) -> None:
    """A tokenizer carrying the zoo's format as a Jinja template: auto renders exactly the registry's
    zoo rendering, and encodes to the same ids."""
    tokenizer.chat_template = jinja_chat_template("zoo")
    turns = ["What is 2 + 2?"]
    assert render_prompt("auto", turns, tokenizer) == render("zoo", turns)
    questions = load_questions(ROOT / "prompts/my_prompts.jsonl")[:3]
    assert encode_prompts(questions, tokenizer, "auto", 64) == encode_prompts(questions, tokenizer, "zoo", 64)


def test_template_auto_without_a_chat_template_fails_naming_the_choices(tokenizer) -> None:
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match=r"has no chat_template; set the pair's template to one of"):
        render_prompt("auto", ["hello"], tokenizer)
    with pytest.raises(ValueError, match="none was given"):
        render_prompt("auto", ["hello"])


def test_a_hub_id_not_in_the_local_cache_names_the_offline_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotLocalError, match=r"pairs\.x\.target: 'acme/no-such-model' .*HF_HUB_OFFLINE"):
        resolve_model("acme/no-such-model", tmp_path, "pairs.x.target")
    folder = tmp_path / "acme" / "local"
    folder.mkdir(parents=True)
    assert resolve_model("acme/local", tmp_path, "pairs.x.mid") == folder  # a folder wins over the Hub


def test_a_hub_id_in_the_local_cache_resolves_to_its_snapshot(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("0" * 40, encoding="utf-8")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert resolve_model("acme/tiny", tmp_path, "pairs.x.target") == snapshot


COPIED = ("config", "decoder", "features", "collectors", "models", "pipeline", "profiles", "prompts")


def _run(args: list[str], root: Path, timeout: int) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    env |= {"PYTHONPATH": str(root), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-6000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_the_walkthrough_through_dvc_as_a_new_user(tmp_path: Path) -> None:
    """The README's 3 steps on a copy of the project: declare the pair (two smoke-zoo checkpoints
    copied under new names, a 12-prompt Spec-Bench file, an overlay at smoke sizes), run the
    pipeline through DVC, decode with the bundle through the CLI."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    if dvc is None:
        pytest.skip("dvc is not installed in this environment")
    walkthrough(tmp_path, dvc)


def walkthrough(tmp_path: Path, dvc: str, *targets: str) -> None:
    """The walkthrough in ``tmp_path``; ``targets``: the dvc.yaml stages to reproduce (all if none)."""
    for name in COPIED:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text(encoding="utf-8"))
    assert "prompts" in stages["stages"]["data"]["deps"]  # a user's prompts are a DVC dependency
    py = sys.executable
    # The user's checkpoints: two smoke-zoo models, copied under new names outside the artifacts.
    for stage in ("data", "zoo"):
        _run([py, "-m", f"pipeline.{stage}", "--profile", "smoke"], tmp_path, 600)
    zoo = tmp_path / load_params(profile="smoke").zoo.out_dir
    shutil.copytree(zoo / "target-chat-l", tmp_path / "checkpoints" / "acme-target")
    shutil.copytree(zoo / "mid-chat", tmp_path / "checkpoints" / "acme-mid")
    shutil.rmtree(tmp_path / "artifacts")
    # Step 1: declare the pair and its prompts.
    (tmp_path / "prompts" / "question.jsonl").write_text("\n".join(spec_bench_lines()) + "\n")
    overlay = yaml.safe_load((ROOT / "profiles/my-pair.yaml").read_text(encoding="utf-8"))
    overlay["data"]["questions"] = "prompts/question.jsonl"
    overlay["pairs"] = {"acme": {**overlay["pairs"]["my-pair"], "target": "checkpoints/acme-target",
                                 "mid": "checkpoints/acme-mid"}}  # fmt: skip
    overlay = json.loads(json.dumps(overlay).replace('"my-pair"', '"acme"'))
    for section in ("budget", "collect", "evaluate"):
        overlay[section]["datasets"] = list(CATEGORIES)
    smoke = yaml.safe_load((ROOT / "profiles/smoke.yaml").read_text(encoding="utf-8"))
    (tmp_path / "profiles/acme.yaml").write_text(yaml.safe_dump(deep_merge(smoke, overlay)))
    # Step 2: the pipeline through DVC (`dvc exp run -S overlay=acme` sets this key, then reproduces).
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text(encoding="utf-8").replace("overlay: base", "overlay: acme", 1))
    _run([dvc, "init", "--no-scm", "-q"], tmp_path, 60)
    _run([dvc, "repro", *targets], tmp_path, 1500)
    canon = json.loads((tmp_path / "artifacts/canonicalize/metrics.json").read_text())
    assert canon["n_reports"] == len(CATEGORIES) and canon["n_pair_folds"] == 0
    assert (tmp_path / "artifacts/deploy/acme").is_dir()
    # Step 3: decode with the bundle.
    out = _run(
        [py, "-m", "decoder", "--deployment", "artifacts/deploy", "--pair", "acme", "--prompt", "Say hi."],
        tmp_path,
        300,
    )
    assert "pair acme: deploys" in out
