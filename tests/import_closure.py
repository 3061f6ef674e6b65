"""The project modules a stage's process can import (collectors/collect/source_closure.py), as a set."""

from __future__ import annotations

from pathlib import Path

from collectors.collect.source_closure import source_files
from config.params import ROOT

__all__ = ["ROOT", "import_closure"]


def import_closure(module: str) -> set[Path]:
    """Every project file ``python -m module`` may import, with package __init__ files."""
    return set(source_files([module]))
