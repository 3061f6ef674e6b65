"""dvc.yaml tells the truth: a stage lists every project file it can import and every param it reads.

The import side is checked statically (tests/import_closure.py). The params side is enforced at
run time by config.params.restrict, which the stage tests go through (pipeline.cli.stage_params);
here we check that every declared entry names a real key and that the overlay is tracked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from import_closure import ROOT, import_closure

from config.params import load_params
from pipeline.cli import declared_params, stage_params

STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _module(stage: str) -> str:
    match = re.fullmatch(r"python -m (pipeline\.\w+)", STAGES[stage]["cmd"])
    assert match, f"{stage}: cmd {STAGES[stage]['cmd']!r} is not `python -m pipeline.<stage>`"
    return match[1]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_cover_the_import_closure(stage: str) -> None:
    deps = [Path(d) for d in STAGES[stage]["deps"]]
    missing = [
        str(rel)
        for path in sorted(import_closure(_module(stage)))
        if not any((rel := path.relative_to(ROOT)) == d or d in rel.parents for d in deps)
    ]
    assert not missing, f"dvc.yaml stage {stage!r} misses deps it imports: {missing}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_code_deps_exist_and_are_imported(stage: str) -> None:
    """No stale entries: a listed .py file exists and is in the closure (else DVC reruns for nothing)."""
    closure = {p.relative_to(ROOT) for p in import_closure(_module(stage))}
    listed = [Path(d) for d in STAGES[stage]["deps"] if d.endswith(".py")]
    assert all((ROOT / d).is_file() for d in listed)
    assert set(listed) <= closure, sorted(map(str, set(listed) - closure))


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_overlay_and_params_are_tracked(stage: str) -> None:
    assert "profiles/${overlay}.yaml" in STAGES[stage]["deps"]
    assert "overlay" in declared_params(stage)
    stage_params(stage, load_params())  # every entry names a real section or key


def test_the_closure_follows_lazy_and_from_package_imports(tmp_path: Path) -> None:
    closure = {p.relative_to(ROOT).as_posix() for p in import_closure("pipeline.evaluate")}
    assert {"decoder/scheduler.py", "decoder/planning.py", "config/params.py", "pipeline/cli.py"} <= closure
    assert "models/zoo.py" not in closure


def test_a_stage_module_names_its_own_stage() -> None:
    for stage in STAGES:
        source = (ROOT / (_module(stage).replace(".", "/") + ".py")).read_text(encoding="utf-8")
        assert f'run_stage("{stage}", main)' in source, stage
