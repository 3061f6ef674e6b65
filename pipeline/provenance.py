"""What a stage run was made of: git revision, the params it reads, and its input files.

Contract: :func:`git_state` is the repository's HEAD and whether tracked or untracked files differ
from it (``dvc.lock`` excluded: DVC rewrites it after every stage of one pipeline run).
:func:`declared_values` reads, flattened (``collect.max_new_tokens``), exactly the params entries
dvc.yaml lists for a stage, through the restricted Params the stage got, so a logged param is a
param the stage can read. :func:`stage_inputs` are the stage's deps in dvc.yaml but the overlay file
(covered by the params): its data and its code fingerprint (artifacts/fingerprints/<stage>.json);
:func:`data_hash` hashes their contents (file paths relative to each dep, then bytes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, reduce
from pathlib import Path
from typing import Any

import yaml

from config.params import ROOT, Params, plain, resolve
from decoder.io.files import sha256_of_file
from pipeline.cli import declared_params

_VAR = re.compile(r"\$\{([\w.]+)\}")


@dataclass(frozen=True)
class GitState:
    revision: str  # HEAD's sha, "unknown" outside git
    dirty: bool


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dataclasses/params sections/mappings -> {'a.b': value}; tuples become comma-joined strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    obj = plain(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list | tuple):
        obj = ",".join(map(str, obj))
    return {prefix[:-1]: obj}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def git_revision() -> str:
    """``git rev-parse HEAD`` of the repository, or "unknown" outside git."""
    out = _git("rev-parse", "HEAD")
    return out.strip() if out else "unknown"


def git_state() -> GitState:
    revision = git_revision()
    outside_lock = ("--", ".", ":(exclude)dvc.lock")
    status = _git("status", "--porcelain", *outside_lock) or ""
    return GitState(revision, bool(status.strip()))


def json_sha256(obj: Any) -> str:
    """Hash of a JSON-able mapping, independent of key order."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def declared_values(stage: str, params: Params) -> dict[str, Any]:
    """Every param value the stage may read (its dvc.yaml params entries), flattened."""
    out: dict[str, Any] = {}
    for entry in declared_params(stage):
        section, _, key = entry.partition(".")
        value = getattr(params, section)
        out.update(flatten(getattr(value, key) if key else value, f"{entry}."))
    return out


@cache
def _stage_deps(stage: str) -> tuple[str, ...]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    return tuple(str(d) for d in stages[stage].get("deps", []))


def stage_inputs(stage: str, params: Params) -> list[Path]:
    """The stage's data deps in dvc.yaml with ``${section.key}`` read from the stage's params."""

    def value(match: re.Match[str]) -> str:
        return str(reduce(getattr, match[1].split("."), params))

    return [
        resolve(_VAR.sub(value, dep))
        for dep in _stage_deps(stage)
        if not dep.endswith(".py") and not dep.startswith("profiles/")
    ]


def data_hash(paths: Sequence[Path]) -> str:
    """One sha256 over the contents of files and folders (a missing path hashes as missing)."""
    h = hashlib.sha256()
    for root in paths:
        h.update(f"{root.name}\0".encode())
        if root.is_file():
            h.update(sha256_of_file(root).encode())
        elif root.is_dir():
            for f in sorted(p for p in root.rglob("*") if p.is_file()):
                h.update(f"{f.relative_to(root).as_posix()}\0{sha256_of_file(f)}\n".encode())
        else:
            h.update(b"missing\n")
    return h.hexdigest()
