"""The project's layers, checked on the source: each layer imports only the layers below it.

config (params) < decoder < features < collectors < models < pipeline, every module of every
subpackage included. Inside the runtime, decoder/'s subpackages have an order of their own
(`DECODER_ORDER`: io < models < core < graft < deploy < the top-level modules), and every runtime
module is used by the runtime itself (imported by another decoder module, or an entry point): code
only the offline side needs lives in the offline layers. Every import counts, including ones inside
functions: a lazy import does not make an upward dependency acceptable, and may not hide an import
cycle either (the CLI's import of decoder.measure inside the decode loop's module did until the CLI
moved to decoder/cli.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("config", "decoder", "features", "collectors", "models", "pipeline")
# decoder/'s subpackages, lowest first; "" is the package's own top-level modules (generate, the CLIs)
DECODER_ORDER = ("io", "models", "core", "graft", "deploy", "")
# runtime modules that nothing in decoder/ imports: the public API and the command lines
ENTRY_POINTS = {"decoder", "decoder.__main__", "decoder.cli", "decoder.check_lossless"}


def layer_files(layer: str) -> list[Path]:
    """Every module of a layer, its subpackages' included."""
    return sorted((ROOT / layer).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
        for path in layer_files(layer):
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
    """Only decoder/core/state.py spells out the state's order (context, history, signals)."""
    spelled = [
        str(p.relative_to(ROOT))
        for layer in LAYERS
        for p in layer_files(layer)
        if "*CONTEXT_NAMES, *history_names(" in p.read_text(encoding="utf-8")
    ]
    assert spelled == ["decoder/core/state.py"]


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
        for path in layer_files(layer):
            out[module_name(path)] = path.read_text(encoding="utf-8")
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


def decoder_part(module: str) -> str:
    """The decoder subpackage a module of decoder/ belongs to ("" for a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in DECODER_ORDER) else ""


def test_the_checker_walks_subpackages() -> None:
    names = {module_name(p) for p in layer_files("collectors")}
    assert {"collectors.collect.replay", "collectors.pricing.budget_sweep"} <= names
    assert {"decoder.core.tree", "decoder.graft.ddtree", "decoder"} <= {
        module_name(p) for p in layer_files("decoder")
    }


def test_decoder_subpackages_import_only_lower_ones() -> None:
    """io < models < core < graft < deploy < the top-level modules: a subpackage imports its own
    modules and lower subpackages only (the decode core never imports GRAFT or deployment)."""
    packages = {p.parent.name for p in (ROOT / "decoder").glob("*/__init__.py")}
    assert packages == set(DECODER_ORDER) - {""}
    upward = []
    for path in layer_files("decoder"):
        here = DECODER_ORDER.index(decoder_part(module_name(path)))
        for line, module in project_imports(path):
            if module.split(".")[0] == "decoder" and DECODER_ORDER.index(decoder_part(module)) > here:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not upward, "decoder imports from a higher subpackage:\n" + "\n".join(upward)


def offline_only(sources: dict[str, str]) -> list[str]:
    """decoder modules that no other decoder module imports and that are no entry point (packages
    aside): code only the offline side uses. ``sources``: module -> text, decoder's modules only."""
    imported: set[str] = set()
    for module, text in sources.items():
        eager, lazy = split_imports(text)
        imported |= {n for n in eager | lazy if n != module}
    packages = {m for m in sources if (ROOT / m.replace(".", "/") / "__init__.py").exists()}
    return sorted(m for m in sources if m not in imported | ENTRY_POINTS | packages)


def test_every_runtime_module_serves_the_runtime() -> None:
    """No decoder module is there only for the offline side: each is imported by another decoder
    module or is an entry point (the public API, the command lines)."""
    sources = {m: s for m, s in project_sources().items() if m.split(".")[0] == "decoder"}
    unused = offline_only(sources)
    assert not unused, f"decoder modules only offline code imports (move them to an offline layer): {unused}"


def test_the_runtime_check_sees_an_offline_only_module() -> None:
    sources = {
        "decoder.a": "import numpy\n",
        "decoder.cli": "from decoder.b import x\n",
        "decoder.b": "x = 1\n",
    }
    assert offline_only(sources) == ["decoder.a"]
