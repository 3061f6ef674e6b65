"""The evaluate_fixed stage's files: every cell's fixed part and the ablation rows as JSON, and the
target's rows beside it as Parquet.

What no learned policy changes is priced once, upstream of the scheduler's training: per (pair,
dataset) cell, autoregressive decoding's priced ms, the tokens, All-Small, All-Mid, 10101 and the
best fixed schedule in hindsight (all 2^D schedules replayed), the target's continuations, its
top-m rows of each prompt's text and the prompts' digest; and the ablations, decoded for real.
``evaluate`` replays only the policies, from the stored continuations and rows (no target forward),
and merges each cell with its part (collectors/evaluation/priced_tasks.py).
The pair check's calibration cells get the same (All-Small and All-Mid only) in a second file, for
``deploy``.

The target's rows (top-m token ids and log-probabilities at every position of every prompt's text,
99% of the bytes) go to ``<stem>.rows.parquet`` beside the JSON, one row per position; the JSON
names that file and its sha256, so a rows file from another run is refused, not merged.

Contract: a cell read back equals the PricedCell written, field by field and float for float (JSON
writes a float's shortest repr, which reads back to the same double; Parquet stores the doubles).
A file of another schema, a missing cell, a rows file that is missing or not the one written, or an
ill-formed entry is one ValueError (FileNotFoundError for a missing file) naming the file and what
is wrong.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from collectors.evaluation.priced_eval import FIXED, Cell, PricedCell, PricedMethod, TargetRows
from collectors.evaluation.priced_tasks import BUDGET
from decoder.io.files import replace_atomically, sha256_of_file

SCHEMA = "treegraft-evaluate-fixed/4"  # 2: the target's rows; 3: the rows as Parquet; 4: per-pass ms
ROWS_SUFFIX = ".rows.parquet"
ROWS_SCHEMA = {
    "pair_id": pl.String,
    "dataset_id": pl.String,
    "prompt": pl.Int32,  # the prompt's index in the cell
    "tokens": pl.List(pl.Int64),  # top-m token ids at one position, best first
    "logps": pl.List(pl.Float64),  # their log-probabilities
}
FILE = "fixed.json"
CALIBRATION_FILE = "calibration.json"
FOLDER = "fixed"  # under evaluate.out_dir
# the fixed schedules every cell reports; "budget": the pair's own budget-stage schedule, where it has one
FIXED_METHODS = {**FIXED, "10101": "10101", BUDGET: BUDGET}
RERUN = "rerun the evaluate_fixed stage"


def _floats(a: np.ndarray) -> list[float]:
    return [float(x) for x in a]


def _passes(a: np.ndarray | None) -> list[list[float]] | None:
    return None if a is None else [_floats(row) for row in a]


def _pass_array(v: object, n_prompts: int) -> np.ndarray | None:
    """A stored (n_passes, n_prompts) array, or None; a ValueError when its shape is wrong."""
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    if a.ndim != 2 or a.shape[1] != n_prompts:
        raise ValueError(f"per-pass figures of shape {a.shape}, expected (passes, {n_prompts})")
    return a


def method_record(m: PricedMethod) -> dict:
    return {"name": m.name, "schedule": m.schedule, "ms": _floats(m.ms), "tokens": _floats(m.tokens),
            "accepted": m.accepted, "mid_calls_per_step": list(m.mid_calls_per_step),
            "pass_ms": _passes(m.pass_ms)}  # fmt: skip


def cell_record(c: PricedCell) -> dict:
    return {
        "ar_ms": _floats(c.ar_ms),
        "tokens": _floats(c.tokens),
        "methods": [method_record(m) for m in c.methods.values()],
        "best_fixed": c.best_fixed,
        "continuations": [[list(g), limit] for g, limit in c.continuations],
        "prompts_sha256": c.prompts_sha256,
        "n_prompts": len(c.rows),  # prompts with target rows (the rows file holds them)
        "pass_ar_ms": _passes(c.pass_ar_ms),
    }


def _method(r: Mapping) -> PricedMethod:
    ms = np.asarray(r["ms"], dtype=float)
    return PricedMethod(
        str(r["name"]), str(r["schedule"]), ms, np.asarray(r["tokens"], dtype=float), float(r["accepted"]),
        tuple(float(x) for x in r["mid_calls_per_step"]), _pass_array(r["pass_ms"], len(ms)),
    )  # fmt: skip


def rows_path(path: Path) -> Path:
    """The rows file beside a stage file: ``fixed.json`` -> ``fixed.rows.parquet``."""
    return path.with_name(path.stem + ROWS_SUFFIX)


def rows_table(cells: Mapping[Cell, PricedCell]) -> pl.DataFrame:
    """Every cell's target rows, one row per (cell, prompt, position), in order."""
    cols: dict[str, list] = {name: [] for name in ROWS_SCHEMA}
    for (pair, dataset), c in cells.items():
        for i, (tokens, logps) in enumerate(c.rows):
            n = len(tokens)
            cols["pair_id"] += [pair] * n
            cols["dataset_id"] += [dataset] * n
            cols["prompt"] += [i] * n
            cols["tokens"] += [list(t) for t in tokens]
            cols["logps"] += [list(lp) for lp in logps]
    return pl.DataFrame(cols, schema=ROWS_SCHEMA)


def rows_of(table: pl.DataFrame) -> dict[Cell, tuple[TargetRows, ...]]:
    """The cells' target rows from :func:`rows_table`'s table."""
    out: dict[Cell, list[tuple[list, list]]] = {}
    cols = [table[name].to_list() for name in ROWS_SCHEMA]
    for pair, dataset, prompt, tokens, logps in zip(*cols, strict=True):
        prompts = out.setdefault((pair, dataset), [])
        if prompt < len(prompts) - 1:
            raise ValueError(f"cell {pair}/{dataset}: prompt {prompt} out of order")
        while len(prompts) <= prompt:  # a prompt without rows has no line
            prompts.append(([], []))
        prompts[-1][0].append(tuple(tokens))
        prompts[-1][1].append(tuple(logps))
    return {c: tuple((tuple(t), tuple(lp)) for t, lp in ps) for c, ps in out.items()}


def cell_from(r: Mapping, rows: tuple[TargetRows, ...]) -> PricedCell:
    methods = [_method(m) for m in r["methods"]]
    return PricedCell(
        np.asarray(r["ar_ms"], dtype=float),
        np.asarray(r["tokens"], dtype=float),
        {m.name: m for m in methods},
        str(r["best_fixed"]),
        tuple((tuple(int(t) for t in g), int(limit)) for g, limit in r["continuations"]),
        str(r["prompts_sha256"]),
        rows,
        _pass_array(r["pass_ar_ms"], len(r["ar_ms"])),
    )


def fixed_path(evaluate_out_dir: Path) -> Path:
    """Where the evaluate_fixed stage writes the held-back cells: ``<evaluate.out_dir>/fixed/fixed.json``
    (and their rows: ``fixed.rows.parquet``)."""
    return evaluate_out_dir / FOLDER / FILE


def calibration_path(evaluate_out_dir: Path) -> Path:
    """Where it writes the pair check's calibration cells (the endpoints only, for ``deploy``):
    ``<evaluate.out_dir>/fixed/calibration.json`` (and ``calibration.rows.parquet``)."""
    return evaluate_out_dir / FOLDER / CALIBRATION_FILE


def write_fixed(path: Path, cells: Mapping[Cell, PricedCell], ablations: Sequence[dict]) -> Path:
    """Write the stage's JSON file and its rows file, each atomically, rows first: a failure between
    the two leaves a JSON naming another rows digest, which :func:`read_fixed` refuses."""
    buffer = io.BytesIO()
    rows_table(cells).write_parquet(buffer, compression="zstd", statistics=False)
    rows_file = replace_atomically(rows_path(path), buffer.getvalue())
    body = {
        "schema_version": SCHEMA,
        "rows_file": {"name": rows_file.name, "sha256": sha256_of_file(rows_file)},
        "cells": [{"pair_id": p, "dataset_id": d, **cell_record(c)} for (p, d), c in cells.items()],
        "ablations": list(ablations),
    }
    return replace_atomically(path, (json.dumps(body) + "\n").encode())


def _read_rows(path: Path, entry: Mapping) -> dict[Cell, tuple[TargetRows, ...]]:
    rows_file = path.parent / str(entry["name"])
    if rows_file != rows_path(path):
        raise ValueError(f"rows_file {entry['name']!r}, expected {rows_path(path).name!r}")
    if not rows_file.is_file():
        raise FileNotFoundError(f"{rows_file}: missing; {RERUN}")
    if sha256_of_file(rows_file) != entry["sha256"]:
        raise ValueError(f"{rows_file.name} is not the rows file written with it (its sha256 differs)")
    table = pl.read_parquet(rows_file)
    if dict(table.schema) != ROWS_SCHEMA:
        raise ValueError(f"{rows_file.name} has columns {dict(table.schema)}, expected {ROWS_SCHEMA}")
    return rows_of(table)


def read_fixed(path: Path, wanted: Sequence[Cell]) -> tuple[dict[Cell, PricedCell], list[dict]]:
    """The fixed parts of the ``wanted`` cells and the ablation rows, from the stage's file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run the evaluate_fixed stage first")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        if body.get("schema_version") != SCHEMA:
            raise ValueError(f"schema_version {body.get('schema_version')!r}, expected {SCHEMA!r}")
        rows = _read_rows(path, body["rows_file"])
        cells = {}
        for e in body["cells"]:
            cell = (e["pair_id"], e["dataset_id"])
            found, n = rows.get(cell, ()), int(e["n_prompts"])
            if len(found) > n:
                raise ValueError(f"cell {cell[0]}/{cell[1]}: rows of {len(found)} prompts, {n} written")
            cells[cell] = cell_from(e, found + tuple(((), ()) for _ in range(n - len(found))))
        ablations = list(body["ablations"])
    except (ValueError, KeyError, TypeError, AttributeError, pl.exceptions.PolarsError) as err:
        raise ValueError(
            f"{path}: not an evaluate_fixed file ({err}); rerun the evaluate_fixed stage"
        ) from err
    missing = [f"{p}/{d}" for p, d in wanted if (p, d) not in cells]
    if missing:
        raise ValueError(f"{path}: no fixed part for cell(s) {missing}; {RERUN}")
    return {c: cells[c] for c in wanted}, ablations
