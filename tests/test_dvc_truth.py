"""dvc.yaml tells the truth: a stage depends on the fingerprint of exactly the code it can import,
and lists every param it reads.

The code side: each stage's only code dependency is ``artifacts/fingerprints/<stage>.json``
(pipeline/fingerprint.py), which covers the stage module's whole import closure (found statically,
lazy imports included: tests/import_closure.py). The params side is enforced at run time by
config.params.restrict, which the stage tests go through (pipeline.cli.stage_params); here we check
that every declared entry names a real key and that the overlay is tracked.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
import yaml
from import_closure import ROOT, import_closure

from config.params import load_params
from pipeline.cli import declared_params, stage_params
from pipeline.fingerprint import OUT_DIR, fingerprints, stage_modules

SPEC = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
STAGES = {name: spec for name, spec in SPEC.items() if name != "fingerprint"}
CODE_DIRS = ("config", "decoder", "features", "collectors", "models", "pipeline")
_fingerprints = cache(fingerprints)


def _module(stage: str) -> str:
    match = re.fullmatch(r"python -m (pipeline\.\w+)", STAGES[stage]["cmd"])
    assert match, f"{stage}: cmd {STAGES[stage]['cmd']!r} is not `python -m pipeline.<stage>`"
    return match[1]


def test_the_fingerprint_stage_comes_first_and_watches_every_code_folder() -> None:
    assert next(iter(SPEC)) == "fingerprint"
    assert set(SPEC["fingerprint"]["deps"]) == set(CODE_DIRS)
    assert [next(iter(o)) if isinstance(o, dict) else o for o in SPEC["fingerprint"]["outs"]] == [
        OUT_DIR.as_posix()
    ]
    assert stage_modules() == {stage: _module(stage) for stage in STAGES}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_depends_on_its_fingerprint_and_on_no_source_file(stage: str) -> None:
    deps = STAGES[stage]["deps"]
    assert (OUT_DIR / f"{stage}.json").as_posix() in deps
    code = [d for d in deps if d.endswith(".py") or d.split("/")[0] in CODE_DIRS]
    assert not code, f"{stage}: code deps besides its fingerprint: {code}"
    assert not [
        d for d in deps if d.startswith(OUT_DIR.as_posix()) and d != f"{OUT_DIR.as_posix()}/{stage}.json"
    ]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_the_fingerprint_covers_the_import_closure(stage: str) -> None:
    """What tests/test_dvc_truth.py checked file by file before: every file the stage's process can
    import is in its fingerprint, and nothing else is."""
    closure = {p.relative_to(ROOT).as_posix() for p in import_closure(_module(stage))}
    files = set(_fingerprints()[stage]["files"])
    assert files == closure
    assert f"pipeline/{stage}.py" in files or _module(stage).replace(".", "/") + ".py" in files


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_overlay_and_params_are_tracked(stage: str) -> None:
    assert "profiles/${overlay}.yaml" in STAGES[stage]["deps"]
    assert "overlay" in declared_params(stage)
    stage_params(stage, load_params())  # every entry names a real section or key


def test_the_closure_follows_lazy_and_from_package_imports(tmp_path: Path) -> None:
    closure = {p.relative_to(ROOT).as_posix() for p in import_closure("pipeline.evaluate")}
    expected = {"decoder/deploy/scheduler.py", "decoder/deploy/planning.py", "config/params.py"}
    expected.add("pipeline/cli.py")
    assert expected <= closure
    assert "models/zoo.py" not in closure


def test_a_stage_module_names_its_own_stage() -> None:
    for stage in STAGES:
        source = (ROOT / (_module(stage).replace(".", "/") + ".py")).read_text(encoding="utf-8")
        assert f'run_stage("{stage}", main)' in source, stage


def _imported(path: Path) -> set[str]:
    """Every module an import in the file names; ``from pkg import x`` names ``pkg.x`` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_no_stage_module_imports_another_stage_module() -> None:
    """A piece two stages share lives in a lower layer: a stage module imports no other stage's."""
    modules = set(stage_modules().values())
    crossing = {
        f"{module} imports {name}"
        for module in sorted(modules)
        for name in sorted(_imported(ROOT / (module.replace(".", "/") + ".py")) & (modules - {module}))
    }
    assert not crossing, "\n".join(sorted(crossing))
