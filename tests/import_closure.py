"""The project modules a stage's process can import, found on the source (ast), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def import_closure(module: str) -> set[Path]:
    """Every project file ``python -m module`` may import, with package __init__ files."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            path = module_file(".".join(parts[:i]))
            if path is not None and path not in seen:
                seen.add(path)
                todo.extend(imported_modules(path))
    return seen
