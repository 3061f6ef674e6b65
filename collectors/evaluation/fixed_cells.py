"""The evaluate_fixed stage's files: every cell's fixed part, and the ablation rows, as JSON.

What no learned policy changes is priced once, upstream of the scheduler's training: per (pair,
dataset) cell, autoregressive decoding's priced ms, the tokens, All-Small, All-Mid, 10101 and the
best fixed schedule in hindsight (all 2^D schedules replayed), the target's continuations, its
top-m rows of each prompt's text and the prompts' digest; and the ablations, decoded for real.
``evaluate`` replays only the policies, from the stored continuations and rows (no target forward),
and merges each cell with its part (collectors/evaluation/priced_tasks.py).
The pair check's calibration cells get the same (All-Small and All-Mid only) in a second file, for
``deploy``.

Contract: a cell read back equals the PricedCell written, field by field and float for float (JSON
writes a float's shortest repr, which reads back to the same double). A file of another schema, a
missing cell or an ill-formed entry is one ValueError naming the file and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from collectors.evaluation.priced_eval import FIXED, Cell, PricedCell, PricedMethod, TargetRows
from decoder.files import replace_atomically

SCHEMA = "treegraft-evaluate-fixed/2"  # 2: with the target's rows
FILE = "fixed.json"
CALIBRATION_FILE = "calibration.json"
FOLDER = "fixed"  # under evaluate.out_dir
FIXED_METHODS = {**FIXED, "10101": "10101"}  # the fixed schedules every cell reports
RERUN = "rerun the evaluate_fixed stage"


def _floats(a: np.ndarray) -> list[float]:
    return [float(x) for x in a]


def method_record(m: PricedMethod) -> dict:
    return {"name": m.name, "schedule": m.schedule, "ms": _floats(m.ms), "tokens": _floats(m.tokens),
            "accepted": m.accepted, "mid_calls_per_step": list(m.mid_calls_per_step)}  # fmt: skip


def cell_record(c: PricedCell) -> dict:
    return {
        "ar_ms": _floats(c.ar_ms),
        "tokens": _floats(c.tokens),
        "methods": [method_record(m) for m in c.methods.values()],
        "best_fixed": c.best_fixed,
        "continuations": [[list(g), limit] for g, limit in c.continuations],
        "prompts_sha256": c.prompts_sha256,
        "rows": [[[list(t) for t in tokens], [list(lp) for lp in logps]] for tokens, logps in c.rows],
    }


def _method(r: Mapping) -> PricedMethod:
    return PricedMethod(
        str(r["name"]), str(r["schedule"]), np.asarray(r["ms"], dtype=float),
        np.asarray(r["tokens"], dtype=float), float(r["accepted"]),
        tuple(float(x) for x in r["mid_calls_per_step"]),
    )  # fmt: skip


def _rows(tokens: Sequence, logps: Sequence) -> TargetRows:
    return tuple(tuple(int(t) for t in ts) for ts in tokens), tuple(
        tuple(float(x) for x in lp) for lp in logps
    )


def cell_from(r: Mapping) -> PricedCell:
    methods = [_method(m) for m in r["methods"]]
    return PricedCell(
        np.asarray(r["ar_ms"], dtype=float),
        np.asarray(r["tokens"], dtype=float),
        {m.name: m for m in methods},
        str(r["best_fixed"]),
        tuple((tuple(int(t) for t in g), int(limit)) for g, limit in r["continuations"]),
        str(r["prompts_sha256"]),
        tuple(_rows(tokens, logps) for tokens, logps in r["rows"]),
    )


def fixed_path(evaluate_out_dir: Path) -> Path:
    """Where the evaluate_fixed stage writes the held-back cells: ``<evaluate.out_dir>/fixed/fixed.json``."""
    return evaluate_out_dir / FOLDER / FILE


def calibration_path(evaluate_out_dir: Path) -> Path:
    """Where it writes the pair check's calibration cells (the endpoints only, for ``deploy``):
    ``<evaluate.out_dir>/fixed/calibration.json``."""
    return evaluate_out_dir / FOLDER / CALIBRATION_FILE


def write_fixed(path: Path, cells: Mapping[Cell, PricedCell], ablations: Sequence[dict]) -> Path:
    """Write the stage's file atomically (a failure leaves the old file or none)."""
    body = {
        "schema_version": SCHEMA,
        "cells": [{"pair_id": p, "dataset_id": d, **cell_record(c)} for (p, d), c in cells.items()],
        "ablations": list(ablations),
    }
    return replace_atomically(path, (json.dumps(body) + "\n").encode())


def read_fixed(path: Path, wanted: Sequence[Cell]) -> tuple[dict[Cell, PricedCell], list[dict]]:
    """The fixed parts of the ``wanted`` cells and the ablation rows, from the stage's file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run the evaluate_fixed stage first")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        if body.get("schema_version") != SCHEMA:
            raise ValueError(f"schema_version {body.get('schema_version')!r}, expected {SCHEMA!r}")
        cells = {(e["pair_id"], e["dataset_id"]): cell_from(e) for e in body["cells"]}
        ablations = list(body["ablations"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f"{path}: not an evaluate_fixed file ({err}); rerun the evaluate_fixed stage"
        ) from err
    missing = [f"{p}/{d}" for p, d in wanted if (p, d) not in cells]
    if missing:
        raise ValueError(f"{path}: no fixed part for cell(s) {missing}; {RERUN}")
    return {c: cells[c] for c in wanted}, ablations
