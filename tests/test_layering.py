"""The project's layers, checked on the source: each layer imports only the layers below it.

config (params) < decoder < features < collectors < models < pipeline. Every import counts,
including ones inside functions: a lazy import does not make an upward dependency acceptable, and
may not hide an import cycle either (the CLI's import of decoder.measure inside
decoder/generate.py did until the CLI moved to decoder/cli.py).
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


def _executed_on_import(node: ast.AST) -> bool:
    """False for what importing a module does not run: function bodies and `if TYPE_CHECKING:`."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return False
    return not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))


def split_imports(source: str) -> tuple[set[str], set[str]]:
    """(project modules imported when the module is imported, project modules imported only inside
    functions), absolute imports; `from pkg import x` also names `pkg.x` (x may be a module)."""
    eager: set[str] = set()
    lazy: set[str] = set()

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Import):
            return {a.name for a in node.names}
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            return {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        return set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and not _executed_on_import(child):
                continue  # typing-only imports never run
            inner = in_function or not _executed_on_import(child)
            found = {n for n in names(child) if n.split(".")[0] in LAYERS}
            (lazy if inner else eager).update(found)
            visit(child, inner)

    visit(ast.parse(source), False)
    return eager, lazy - eager


def cycle_dodges(sources: dict[str, str]) -> list[str]:
    """Function-level imports of a module whose own import (transitively, eager imports only)
    imports the importing module: a cycle the lazy import only hides. ``sources``: module -> text."""
    split = {m: split_imports(s) for m, s in sources.items()}

    def eager_closure(module: str) -> set[str]:
        seen, todo = set(), [module]
        while todo:
            m = todo.pop()
            parts = m.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in split and prefix not in seen:
                    seen.add(prefix)
                    todo.extend(split[prefix][0])
        return seen

    return [
        f"{m} imports {n} inside a function; {n} imports {m}"
        for m, (_, lazy) in sorted(split.items())
        for n in sorted(lazy)
        if n in split and m in eager_closure(n)
    ]


def project_sources() -> dict[str, str]:
    out = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).glob("*.py")):
            name = layer if path.stem == "__init__" else f"{layer}.{path.stem}"
            out[name] = path.read_text(encoding="utf-8")
    return out


def test_no_function_level_import_hides_a_cycle() -> None:
    """A lazy import may keep a heavy or optional dependency off a module's import; it may not
    hide an import cycle (the shared piece then belongs lower, or in an entry point)."""
    assert cycle_dodges(project_sources()) == []


def test_the_cycle_check_sees_a_hidden_cycle() -> None:
    sources = {
        "decoder.a": "from decoder.b import run\n",
        "decoder.b": "def run():\n    from decoder.a import x\n",
        "decoder.c": "import typing\nif typing.TYPE_CHECKING:\n    from decoder.a import x\n",
        "decoder.d": "def f():\n    import decoder.c\n",
    }
    # b hides a -> b -> a; c's typing-only import never runs; d's lazy import closes no cycle
    assert cycle_dodges(sources) == [
        "decoder.b imports decoder.a inside a function; decoder.a imports decoder.b"
    ]
    assert split_imports(sources["decoder.c"]) == (set(), set())
