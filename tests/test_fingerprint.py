"""Code fingerprints: a docstring, comment or formatting edit changes no stage's digest; a change to
what the code does changes the digest of exactly the stages that import the file; and DVC, given
those digests as deps, reruns nothing but the fingerprint stage after a docstring edit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.collect.source_closure import normalised_source, source_files
from config.params import ROOT
from pipeline.fingerprint import stage_modules

CODE_DIRS = ("config", "decoder", "features", "collectors", "models", "pipeline")

BASE = '''"""Module docstring."""

LIMIT = 3  # a comment


def f(x, scale=2):
    """Function docstring."""
    return x * scale + LIMIT


class C:
    """Class docstring."""

    def g(self):
        return 1
'''


def test_docstrings_comments_and_formatting_do_not_count() -> None:
    edited = (
        BASE.replace("Module docstring.", "Another text, longer.\n\nWith a paragraph.")
        .replace("# a comment", "# another comment")
        .replace("Function docstring.", "Says something else.")
        .replace('"""Class docstring."""\n', "")
        .replace("return x * scale + LIMIT", "return (x *   scale\n            + LIMIT)  # why")
    )
    assert normalised_source(edited) == normalised_source(BASE)


@pytest.mark.parametrize(
    "edit",
    [
        ("LIMIT = 3", "LIMIT = 4"),
        ("x * scale", "x / scale"),
        ("scale=2", "scale=3"),
        ("return 1", "return 2"),
    ],
    ids=["constant", "operator", "default-argument", "method-body"],
)
def test_a_change_to_what_the_code_does_counts(edit: tuple[str, str]) -> None:
    assert normalised_source(BASE.replace(*edit)) != normalised_source(BASE)


def test_a_body_that_is_only_a_docstring_still_differs_from_one_that_returns() -> None:
    assert normalised_source('def f():\n    """Doc."""\n') == normalised_source("def f():\n    pass\n")
    assert normalised_source('def f():\n    """Doc."""\n') != normalised_source("def f():\n    return 0\n")


def _copy_code(dest: Path) -> None:
    for name in CODE_DIRS:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))


def _fingerprint(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run(
        [sys.executable, "-m", "pipeline.fingerprint"], cwd=root, env=env, check=True, capture_output=True
    )
    return {
        p.stem: p.read_text(encoding="utf-8")
        for p in sorted((root / "artifacts/fingerprints").glob("*.json"))
    }


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the code folders; the tests below fingerprint it in processes of their own (slow)."""
    root = tmp_path_factory.mktemp("tree")
    _copy_code(root)
    return root


@pytest.mark.slow
def test_docstring_edit_keeps_every_digest_and_a_semantic_edit_moves_exactly_its_importers(
    tree: Path,
) -> None:
    before = _fingerprint(tree)
    assert set(before) == set(stage_modules())
    params_py = tree / "config/params.py"
    original = params_py.read_text(encoding="utf-8")
    _edit(params_py, '"""', '"""A new first line of the module docstring.\n\n')
    _edit(params_py, "\ndef ", "\n# A comment that explains nothing new.\ndef ")
    assert _fingerprint(tree) == before
    params_py.write_text(original, encoding="utf-8")

    # collectors/data/embedded_data.py is imported by some stages (data) and not by others (zoo).
    target = "collectors/data/embedded_data.py"
    importers = {s for s, m in stage_modules().items() if ROOT / target in source_files([m])}
    assert importers and importers != set(before)
    _edit(tree / target, "\ndef ", "\n_FINGERPRINT_PROBE = 1\n\n\ndef ")
    after = _fingerprint(tree)
    assert {s for s in before if before[s] != after[s]} == importers
    assert target in json.loads(after[sorted(importers)[0]])["files"]


@pytest.mark.slow
def test_dvc_reruns_only_the_fingerprint_stage_after_a_docstring_edit(tmp_path: Path) -> None:
    """The real tool: a two-stage dvc.yaml on a copy of the code, repro, a docstring edit, repro."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    if dvc is None:
        pytest.skip("dvc is not installed in this environment")
    _copy_code(tmp_path)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  fingerprint:\n"
        "    cmd: python -m pipeline.fingerprint\n"
        f"    deps: [{', '.join(CODE_DIRS)}]\n"
        "    outs:\n"
        "      - artifacts/fingerprints: {cache: false}\n"
        + "".join(
            f"  {s}:\n    cmd: cp artifacts/fingerprints/{s}.json {s}.txt\n"
            f"    deps: [artifacts/fingerprints/{s}.json]\n    outs: [{s}.txt]\n"
            for s in ("data", "zoo")
        ),
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }

    def dvc_run(*args: str) -> str:
        done = subprocess.run([dvc, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    dvc_run("init", "--no-scm", "-q")
    first = dvc_run("repro")
    assert "Running stage 'data'" in first and "Running stage 'zoo'" in first
    _edit(tmp_path / "config/params.py", '"""', '"""An edited docstring line.\n\n')
    second = dvc_run("repro")
    assert "Running stage 'fingerprint'" in second
    assert "Running stage 'data'" not in second and "Running stage 'zoo'" not in second
    assert "up to date" in dvc_run("status") or dvc_run("status").strip() == ""
    _edit(tmp_path / "collectors/data/embedded_data.py", "\ndef ", "\n_FINGERPRINT_PROBE = 1\n\n\ndef ")
    third = dvc_run("repro")
    assert "Running stage 'data'" in third and "Running stage 'zoo'" not in third


def _resume_code_digest(root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "from collectors.collect.plan import REPORT_CODE, digest_code; print(digest_code(REPORT_CODE))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.mark.slow
def test_collects_resume_key_keeps_reports_across_a_comment_edit_not_a_code_edit(tree: Path) -> None:
    before = _resume_code_digest(tree)
    ngram = tree / "decoder/core/ngram.py"
    original = ngram.read_text(encoding="utf-8")
    _edit(ngram, "\nclass ", "\n# Why this is here, said again.\nclass ")
    assert _resume_code_digest(tree) == before
    _edit(ngram, "\nclass ", "\n_RESUME_PROBE = 1\n\n\nclass ")
    assert _resume_code_digest(tree) != before
    ngram.write_text(original, encoding="utf-8")
