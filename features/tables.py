"""Declared Parquet tables and the one place that reads and writes them.

Contract: a `TableSpec` names a table, its schema version and its columns (name -> Arrow type).
`write_table` refuses rows whose columns or types differ from the spec and writes atomically (a
temporary file in the same folder, fsynced, then a rename and an fsync of the folder), so a reader
never sees half a file, not even after a power loss.
`read_table` checks the stored version and every column's name and type, and names the file in
any error.
Both check the spec's value contract (features/contracts.py: nulls, finiteness, ranges, unique keys,
rows per report) and raise a `ContractError` naming the file, the column, the rule, the number of
rows that break it and the key of the first. A writer that writes several tables as one output
records their sha256 in ``tables.json`` beside them (`write_tables`); `read_table` verifies a file
listed there before it parses it, so a value changed inside its contract (a flipped mantissa bit) or
a table that lost a report is refused too. A checksum catches accidents and edits by hand, not an
editor who rewrites ``tables.json`` as well.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from decoder.io.files import fsync_dir, sha256_of_file
from features.contracts import NO_CONTRACT, Contract, first_violation

VERSION_KEY = b"treegraft_schema"
MANIFEST = "tables.json"


class SchemaError(ValueError):
    """A table does not match its declared schema (or was written by another schema version)."""


class ContractError(SchemaError):
    """A table's values break its spec's contract, or its bytes differ from the writer's digest."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    version: str
    columns: tuple[tuple[str, pa.DataType], ...]
    contract: Contract = NO_CONTRACT

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(list(self.columns), metadata={VERSION_KEY: self.tag.encode()})

    @property
    def tag(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]


def to_table(spec: TableSpec, rows: list[dict]) -> pa.Table:
    """Build an Arrow table from row dicts with exactly the spec's columns."""
    for i, row in enumerate(rows):
        if set(row) != set(spec.names):
            extra, missing = sorted(set(row) - set(spec.names)), sorted(set(spec.names) - set(row))
            raise SchemaError(f"{spec.tag} row {i}: unexpected columns {extra}, missing {missing}")
    columns = {n: [row[n] for row in rows] for n in spec.names}
    try:
        return pa.table(columns, schema=spec.schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise SchemaError(f"{spec.tag}: {err}") from err


def write_table(path: Path, spec: TableSpec, table: pa.Table) -> None:
    """Atomically write a table that must match the spec and keep its contract exactly.

    If ``tables.json`` beside it lists the file, its digest there is updated, so the manifest always
    describes what this helper last wrote."""
    check_schema(spec, table.schema, str(path))
    check_values(spec, table, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table.replace_schema_metadata(spec.schema.metadata), tmp)
        fsync_file(tmp)
        digest = sha256_of_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    recorded = read_manifest(path.parent)
    if path.name in recorded and recorded[path.name] != digest:
        _write_manifest(path.parent, {**recorded, path.name: digest})


def write_tables(folder: Path, tables: Mapping[str, tuple[TableSpec, pa.Table]]) -> None:
    """Write ``<name>.parquet`` for each table, then ``tables.json`` {file: sha256} recording them all.

    The old manifest goes first, so a run killed halfway leaves tables without a record (read
    unchecked against digests), never a record that contradicts them."""
    (folder / MANIFEST).unlink(missing_ok=True)
    for name, (spec, table) in tables.items():
        write_table(folder / f"{name}.parquet", spec, table)
    _write_manifest(folder, {f"{n}.parquet": sha256_of_file(folder / f"{n}.parquet") for n in tables})


def read_manifest(folder: Path) -> dict[str, str]:
    """``tables.json`` in ``folder`` ({} if there is none); a malformed one is a ContractError."""
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ContractError(f"{path}: not a readable table manifest ({err})") from err
    if not isinstance(recorded, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in recorded.items()
    ):
        raise ContractError(f"{path}: expected an object {{file: sha256 hex}}")
    return recorded


def _write_manifest(folder: Path, recorded: Mapping[str, str]) -> None:
    path = folder / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(dict(sorted(recorded.items())), indent=2) + "\n")
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(folder)
    finally:
        tmp.unlink(missing_ok=True)


def check_digest(path: Path) -> None:
    """Raise ContractError if ``tables.json`` beside ``path`` records another sha256 for it."""
    want = read_manifest(path.parent).get(path.name)
    if want is not None and sha256_of_file(path) != want:
        raise ContractError(
            f"{path}: sha256 differs from the digest its writer recorded in {path.parent / MANIFEST} "
            "(changed or corrupted since it was written)"
        )


def check_values(spec: TableSpec, table: pa.Table, where: str) -> None:
    broken = first_violation(spec.contract, table)
    if broken is not None:
        raise ContractError(f"{where}: {spec.tag} {broken}")


def fsync_file(path: Path) -> None:
    """Flush a written file's data to disk (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_schema(spec: TableSpec, schema: pa.Schema, where: str) -> None:
    names = schema.names
    if names != spec.names:
        raise SchemaError(f"{where}: columns {names} differ from {spec.tag} columns {spec.names}")
    for name, typ in spec.columns:
        if not schema.field(name).type.equals(typ):
            raise SchemaError(f"{where}: column {name!r} is {schema.field(name).type}, expected {typ}")


def stored_tag(path: Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    tag = meta.get(VERSION_KEY)
    return tag.decode() if tag else None


def read_table(path: Path, spec: TableSpec) -> pa.Table:
    """Read and validate a table written by `write_table` with the same spec."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such table")
    check_digest(path)
    try:
        tag = stored_tag(path)
        if tag != spec.tag:
            raise SchemaError(f"{path}: written as {tag!r}, this code reads {spec.tag!r}")
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{path}: not a readable Parquet table ({err})") from err
    check_schema(spec, table.schema, str(path))
    check_values(spec, table, str(path))
    return table
