"""The project source a module can import, found on the source itself (ast, lazy imports included).

Used for the code digest in a report's resume key (collectors/plan.py) and by the test that checks
each DVC stage's deps against what its module imports (tests/test_dvc_truth.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from config.params import ROOT

PACKAGES = ("config", "decoder", "features", "collectors", "models", "pipeline")


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
