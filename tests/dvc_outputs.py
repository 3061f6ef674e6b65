"""What dvc.yaml declares a stage writes (outs, metrics, plots), resolved against a Params."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from config.params import ROOT, Params


def declared_paths(params: Params, stages: Iterable[str]) -> dict[str, list[Path]]:
    """Per stage, its outs/metrics/plots paths with ``${section.key}`` filled in from params."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]

    def resolve(text: str) -> Path:
        return Path(re.sub(r"\$\{(\w+)\.(\w+)\}", lambda m: str(getattr(getattr(params, m[1]), m[2])), text))

    out = {}
    for stage in stages:
        entries = [e for key in ("outs", "metrics", "plots") for e in spec[stage].get(key, [])]
        out[stage] = [resolve(next(iter(e)) if isinstance(e, dict) else e) for e in entries]
    return out
