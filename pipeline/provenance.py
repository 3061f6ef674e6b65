"""What a stage run was made of: git revision, its code, the params it reads, and its input files.

Contract: :func:`git_state` is the repository's HEAD and whether tracked or untracked files differ
from it (``dvc.lock`` excluded: DVC rewrites it after every stage of one pipeline run).
:func:`code_digest` is one sha256 over the code of the working tree: every file under
:data:`CODE_PATHS` that git does not ignore (tracked or not), by path and git blob id, so docs, the
log and dvc.lock never count; :func:`commit_code_digest` is the same digest of a commit's tree, so
"this checkout runs the code of that commit" is one comparison. Params are not in it: they count by
value (:func:`pipeline_values`, the whole params.yaml plus overlay, hashed with :func:`json_sha256`),
so a comment in params.yaml or ``dvc exp run -S`` rewriting the file does not change what ran.
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
# What a pipeline run computes with, besides its params: the packages, the benchmarks and the stage graph.
CODE_PATHS = ("config", "decoder", "features", "collectors", "models", "pipeline", "benchmarks", "dvc.yaml")
UNTRACKED = ("mlflow",)  # where runs are written: not part of what a pipeline run computes


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


def _git(*args: str, root: Path | None = None, stdin: str | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root or ROOT, input=stdin, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def git_revision(root: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the repository, or "unknown" outside git."""
    out = _git("rev-parse", "HEAD", root=root)
    return out.strip() if out else "unknown"


def commits_after(commit: str, most: int, root: Path | None = None) -> list[str] | None:
    """The commits reachable from HEAD but not from ``commit``, oldest first (at most ``most``);
    None where git does not know ``commit``."""
    out = _git("rev-list", "--reverse", f"--max-count={most}", f"{commit}..HEAD", root=root)
    return None if out is None else out.split()


def git_state() -> GitState:
    revision = git_revision()
    outside_lock = ("--", ".", ":(exclude)dvc.lock")
    status = _git("status", "--porcelain", *outside_lock) or ""
    return GitState(revision, bool(status.strip()))


def _digest(entries: Sequence[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for path, blob in sorted(entries):
        h.update(f"{path}\0{blob}\n".encode())
    return h.hexdigest()


def code_digest(root: Path | None = None) -> str | None:
    """The working tree's code: sha256 over (path, git blob id) of every file under CODE_PATHS that
    git does not ignore; None outside git."""
    root = root or ROOT
    listed = _git(
        "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *CODE_PATHS, root=root
    )
    if listed is None:
        return None
    # a tracked file deleted from the tree is not code that runs; a commit's tree lacks it the same way
    paths = sorted({p for p in listed.split("\0") if p and (root / p).is_file()})
    blobs = _git("hash-object", "--stdin-paths", root=root, stdin="\n".join(paths)) if paths else ""
    if blobs is None:
        return None
    return _digest(list(zip(paths, blobs.split(), strict=True)))


def commit_code_digest(commit: str, root: Path | None = None) -> str | None:
    """:func:`code_digest` of a commit's tree; None where git does not know the commit."""
    listed = _git("ls-tree", "-r", "-z", commit, "--", *CODE_PATHS, root=root)
    if listed is None:
        return None
    entries = []
    for item in filter(None, listed.split("\0")):
        meta, path = item.split("\t", 1)
        _mode, kind, blob = meta.split()
        if kind == "blob":
            entries.append((path, blob))
    return _digest(entries)


def file_at(commit: str, path: str, root: Path | None = None) -> str | None:
    """The text of ``path`` in ``commit``; None where the commit has no such file."""
    return _git("show", f"{commit}:{path}", root=root)


def pipeline_values(params: Params) -> dict[str, Any]:
    """Every param of params.yaml plus its overlay, flattened, but where runs are written."""
    full = plain(params)
    return flatten({k: v for k, v in full.items() if k not in UNTRACKED})


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
