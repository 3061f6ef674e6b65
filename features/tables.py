"""Declared Parquet tables and the one place that reads and writes them.

Contract: a `TableSpec` names a table, its schema version and its columns (name -> Arrow type).
`write_table` refuses rows whose columns or types differ from the spec and writes atomically (a
temporary file in the same folder, fsynced, then a rename and an fsync of the folder), so a reader
never sees half a file, not even after a power loss.
`read_table` checks the stored version and every column's name and type, and names the file in
any error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from decoder.files import fsync_dir

VERSION_KEY = b"treegraft_schema"


class SchemaError(ValueError):
    """A table does not match its declared schema (or was written by another schema version)."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    version: str
    columns: tuple[tuple[str, pa.DataType], ...]

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
    """Atomically write a table that must match the spec exactly."""
    check_schema(spec, table.schema, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table.replace_schema_metadata(spec.schema.metadata), tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


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
    try:
        tag = stored_tag(path)
        if tag != spec.tag:
            raise SchemaError(f"{path}: written as {tag!r}, this code reads {spec.tag!r}")
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{path}: not a readable Parquet table ({err})") from err
    check_schema(spec, table.schema, str(path))
    return table
