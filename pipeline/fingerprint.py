"""DVC stage ``fingerprint``: one code digest per stage, the stage's only code dependency.

A stage module is a ``pipeline/<name>.py`` that runs ``run_stage("<name>", main)``. For each one this
writes ``artifacts/fingerprints/<name>.json``: the fingerprint of every project file its process can
import (collectors.collect.source_closure: the normalised AST, so docstrings, comments and formatting do not
count), the Python, torch and transformers versions, and one digest over both. DVC reruns this stage
on any edit under the code folders, but a stage downstream only when its own file's bytes change,
that is when code it imports changes what it does.

Cheap on purpose: no params, no MLflow run, nothing imported but the standard library and the
closure walk. ``python -m pipeline.fingerprint --check`` exits 1 and names the stale stages when
the written files disagree with the source (what ``dvc status`` would say about code).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from collectors.collect.source_closure import closure_fingerprint
from config.params import ROOT

OUT_DIR = Path("artifacts/fingerprints")  # dvc.yaml names these files: tests/test_dvc_truth.py
_STAGE = re.compile(r"""run_stage\(\s*["'](\w+)["']\s*,\s*main\s*\)""")


def stage_modules(root: Path = ROOT) -> dict[str, str]:
    """Stage name -> module, for every pipeline module that runs a stage."""
    stages = {}
    for path in sorted((root / "pipeline").glob("*.py")):
        match = _STAGE.search(path.read_text(encoding="utf-8"))
        if match:
            stages[match[1]] = f"pipeline.{path.stem}"
    return stages


def fingerprints() -> dict[str, dict[str, object]]:
    """Per stage, its module and its closure's fingerprint (collectors.collect.source_closure)."""
    return {
        stage: {"stage": stage, "module": module, **closure_fingerprint([module])}
        for stage, module in stage_modules().items()
    }


def render(record: dict[str, object]) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def write(out_dir: Path, records: dict[str, dict[str, object]]) -> list[str]:
    """Write one file per stage (each replaced atomically), drop files of stages that are gone;
    returns the stages whose file changed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for stage, record in records.items():
        path = out_dir / f"{stage}.json"
        text = render(record)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        changed.append(stage)
    for path in out_dir.glob("*.json"):
        if path.stem not in records:
            path.unlink()
    return changed


def stale(out_dir: Path, records: dict[str, dict[str, object]]) -> list[str]:
    """The stages whose written fingerprint is missing or differs from the source's."""
    return [
        stage
        for stage, record in records.items()
        if not (out_dir / f"{stage}.json").is_file()
        or (out_dir / f"{stage}.json").read_text(encoding="utf-8") != render(record)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.fingerprint", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 naming stale stages")
    args = parser.parse_args(argv)
    out_dir = ROOT / OUT_DIR
    records = fingerprints()
    if args.check:
        old = stale(out_dir, records)
        print("stale: " + ", ".join(old) if old else f"{len(records)} stage fingerprints up to date")
        return 1 if old else 0
    changed = write(out_dir, records)
    print(f"{len(records)} stage fingerprints in {OUT_DIR}; changed: {', '.join(changed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
