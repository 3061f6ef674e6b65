"""The project's layers, checked on the source: each layer imports only the layers below it.

config (params) < decoder < features < collectors < models < pipeline. Every import counts,
including ones inside functions: a lazy import does not make an upward dependency acceptable.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("config", "decoder", "features", "collectors", "models", "pipeline")


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import of a project package in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in LAYERS]
    return found


def test_no_import_reaches_up_a_layer() -> None:
    upward = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((ROOT / layer).glob("*.py")):
            for line, module in project_imports(path):
                if LAYERS.index(module.split(".")[0]) > rank:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from pipeline.cli import run_stage\n    import models.zoo\n")
    assert project_imports(source) == [(2, "pipeline.cli"), (3, "models.zoo")]


def test_every_package_is_a_known_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == set(LAYERS)


def test_feature_order_has_one_definition() -> None:
    """Only decoder/state.py spells out the state's order (context, history, signals)."""
    spelled = [
        str(p.relative_to(ROOT))
        for layer in LAYERS
        for p in (ROOT / layer).glob("*.py")
        if "*CONTEXT_NAMES, *history_names(" in p.read_text(encoding="utf-8")
    ]
    assert spelled == ["decoder/state.py"]
