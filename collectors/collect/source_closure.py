"""The project source a module can import, found on the source itself (ast, lazy imports included),
and a fingerprint of that source that only changes when what the code does changes.

A file's fingerprint is the sha256 of its normalised AST: docstrings, comments and formatting are
gone, so they never rerun a stage; a constant, an operator or a default argument is in the AST, so
a change to it does. A closure's digest also covers the Python, torch and transformers versions.
Used by the ``fingerprint`` DVC stage (pipeline/fingerprint.py: one digest per stage, the stage's
only code dependency) and by a report's resume key (collectors/collect/plan.py).
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from config.params import ROOT

PACKAGES = ("config", "decoder", "features", "collectors", "models", "pipeline")
VERSIONED = ("torch", "transformers")  # the libraries whose numerics the stages' outputs carry


def module_file(module: str) -> Path | None:
    """The file of a project module (a package resolves to its __init__.py), or None if not ours."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(source: str) -> set[str]:
    """Every module name the source imports, absolute imports only; ``from pkg import x`` also
    names ``pkg.x`` (x may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def source_files(roots: Iterable[str]) -> list[Path]:
    """The project files the modules ``roots`` can import, package __init__ files included
    (importing a.b.c runs a/__init__ and a/b/__init__ too), sorted."""
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            path = module_file(".".join(parts[:i]))
            if path is not None and path not in seen:
                seen.add(path)
                todo.extend(imported_modules(path.read_text(encoding="utf-8")))
    return sorted(seen)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def normalised_source(source: str) -> str:
    """The source's AST as text, without docstrings, comments, formatting or line numbers."""
    tree = _without_docstrings(ast.parse(source))
    return ast.dump(tree, annotate_fields=True, include_attributes=False)


def file_fingerprint(path: Path) -> str:
    """sha256 of a source file's normalised AST."""
    text = normalised_source(path.read_text(encoding="utf-8"))
    return hashlib.sha256(text.encode()).hexdigest()


def runtime_versions() -> dict[str, str]:
    """The Python, torch and transformers versions (installed metadata: nothing is imported)."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def closure_fingerprint(roots: Iterable[str]) -> dict[str, object]:
    """Per file of the closure of ``roots``, its fingerprint; the versions; and one digest over both."""
    files = {p.relative_to(ROOT).as_posix(): file_fingerprint(p) for p in source_files(roots)}
    body = {"files": files, "versions": runtime_versions()}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {"digest": digest, **body}
