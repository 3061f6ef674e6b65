"""A tiny collect workspace shared by the collect and resume tests: questions, a saved pair, a profile."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from conftest import save_pair, train_tokenizer

from config.params import Params, load_params
from pipeline import collect
from pipeline.cli import stage_params

QUESTIONS = [
    "Explain what this function does and how to test it.",
    "Summarize the module below in two sentences.",
    "Write a docstring for the following class.",
]
TABLES = ("trajectories", "actions", "rounds", "continuations")


def write_questions(root: Path) -> list[str]:
    """Question files of two datasets ("code", "chat") under root / "data"; returns the texts they
    quote (real standard-library source), for training a tokenizer on."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:25]]
    for d, name in enumerate(["code", "chat"]):
        lines = [
            json.dumps({"question_id": i, "category": name, "turns": [q + "\n" + texts[d * 3 + i][:300]]})
            for i, q in enumerate(QUESTIONS)
        ]
        (root / "data" / name).mkdir(parents=True)
        (root / "data" / name / "question.jsonl").write_text("\n".join(lines) + "\n")
    return texts


def build_workspace(root: Path) -> Path:
    """Question files (two datasets), a saved pair with a trained tokenizer and its latency profile."""
    texts = write_questions(root)
    save_pair(root / "pair", train_tokenizer(texts, vocab=300), seed=61)
    from pipeline.profile import main as profile_main

    profile_main(stage_params("profile", params_for(root)))
    return root


def collect_overrides(root: Path, **collect) -> dict:
    """params overrides (the YAML's nesting) for a collect run into ``root / name`` (default "out")."""
    return {
        "mlflow": {"db": str(root / "mlflow.db")},  # the stages log runs: keep them out of the repo's store
        "data": {"out_dir": str(root / "data")},
        "pairs": {"tiny": {"target": str(root / "pair/target"), "mid": str(root / "pair/mid"),
                           "dtype": "float32", "device": "cpu", "template": "zoo", "linear": "stock"}},
        "profile": {"pairs": ["tiny"], "out_dir": str(root / "profile"), "sizes": [1, 16, 64, 160]},
        # every pair at tree.budget unless a test measures budgets (tests/test_budget_stage.py)
        "budget": {"mode": "fixed", "out_dir": str(root / "budget")},
        "collect": {"out_dir": str(root / collect.pop("name", "out")), "pairs": ["tiny"],
                    "datasets": ["code", "chat"], "prompts_per_report": 2, "max_new_tokens": 12,
                    **collect},
    }  # fmt: skip


def params_for(root: Path, **collect) -> Params:
    return load_params(profile="smoke", overrides=collect_overrides(root, **collect))


def run_collect(params: Params) -> dict:
    """The collect stage as DVC runs it: only the params its dvc.yaml entry lists are readable."""
    return collect.main(stage_params("collect", params))


def merged_bytes(params: Params) -> dict[str, bytes]:
    """The stage's merged Parquet files, byte for byte."""
    out = Path(params.collect.out_dir)
    return {name: (out / f"{name}.parquet").read_bytes() for name in TABLES}


def report_stamps(params: Params) -> dict[Path, int]:
    """mtime_ns of every file in every report folder (unchanged = the report was reused); temporary
    folders (hidden names) are not reports."""
    reports = Path(params.collect.out_dir) / "reports"
    return {p: p.stat().st_mtime_ns for p in sorted(reports.glob("*/*")) if not p.parent.name.startswith(".")}


def spy_reports(monkeypatch) -> list[str]:
    """Record the report ids the stage collects (reused reports are never passed to run_report)."""
    calls: list[str] = []
    real = collect.run_report

    def spy(params, spec, reports_dir, progress=True, inputs=None):
        calls.append(spec.report_id)
        return real(params, spec, reports_dir, progress, inputs)

    monkeypatch.setattr(collect, "run_report", spy)
    return calls
