"""features/tables.py: exact columns and types on write and read, versions, atomic files, named errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import features.tables as tables
from decoder.core.state import state_feature_names
from features.collect_schemas import TRAJECTORIES, actions_spec
from features.tables import VERSION_KEY, SchemaError, TableSpec, read_table, to_table, write_table

SPEC = TableSpec(
    "demo",
    "v1",
    (
        ("report_id", pa.string()),
        ("latency_ms", pa.float64()),
        ("n_tokens", pa.int32()),
        ("is_best", pa.bool_()),
        ("sizes", pa.list_(pa.int32())),
    ),
)
ROWS = [
    {"report_id": "a", "latency_ms": 1.5, "n_tokens": 7, "is_best": True, "sizes": [1, 2]},
    {"report_id": "b/é", "latency_ms": math.inf, "n_tokens": -3, "is_best": False, "sizes": []},
]


def _written(path: Path) -> Path:
    write_table(path, SPEC, to_table(SPEC, ROWS))
    return path


def test_round_trip_keeps_values_types_and_version(tmp_path: Path) -> None:
    path = _written(tmp_path / "t.parquet")
    back = read_table(path, SPEC)
    assert back.to_pylist() == ROWS
    assert [(f.name, f.type) for f in back.schema] == list(SPEC.columns)
    assert pq.read_schema(path).metadata[VERSION_KEY] == b"demo/v1"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temporary file left behind


def test_rows_with_wrong_columns_or_types_are_refused() -> None:
    row = ROWS[0]
    with pytest.raises(SchemaError, match=r"row 0: unexpected columns \[\], missing \['sizes'\]"):
        to_table(SPEC, [{k: v for k, v in row.items() if k != "sizes"}])
    with pytest.raises(SchemaError, match=r"row 1: unexpected columns \['extra'\]"):
        to_table(SPEC, [row, {**row, "extra": 1}])
    with pytest.raises(SchemaError, match="demo/v1"):
        to_table(SPEC, [{**row, "latency_ms": "slow"}])
    with pytest.raises(SchemaError, match="demo/v1"):
        to_table(SPEC, [{**row, "n_tokens": 2**40}])  # does not fit int32


def test_write_refuses_a_table_of_another_shape_and_touches_nothing(tmp_path: Path) -> None:
    path = _written(tmp_path / "t.parquet")
    before = path.read_bytes()
    good = to_table(SPEC, ROWS)
    reordered = good.select([*SPEC.names[1:], SPEC.names[0]])
    widened = good.set_column(2, "n_tokens", good.column("n_tokens").cast(pa.int64()))
    with pytest.raises(SchemaError, match=re.escape(f"{path}: columns")):
        write_table(path, SPEC, reordered)
    with pytest.raises(SchemaError, match=re.escape(f"{path}: column 'n_tokens' is int64, expected int32")):
        write_table(path, SPEC, widened)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_reading_another_version_names_the_file_and_both_tags(tmp_path: Path) -> None:
    path = _written(tmp_path / "t.parquet")
    v2 = TableSpec("demo", "v2", SPEC.columns)
    want = f"{path}: written as 'demo/v1', this code reads 'demo/v2'"
    with pytest.raises(SchemaError, match=re.escape(want)):
        read_table(path, v2)
    plain = tmp_path / "plain.parquet"
    pq.write_table(to_table(SPEC, ROWS).replace_schema_metadata(None), plain)  # not via write_table
    with pytest.raises(SchemaError, match=re.escape(f"{plain}: written as None")):
        read_table(plain, SPEC)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'missing.parquet'}: no such table")):
        read_table(tmp_path / "missing.parquet", SPEC)


def test_columns_changed_under_the_same_tag_are_refused_naming_file_and_column(tmp_path: Path) -> None:
    """Same version tag, different content: the per-column check catches what the tag cannot."""
    good = to_table(SPEC, ROWS)
    path = tmp_path / "t.parquet"
    retyped = good.set_column(1, "latency_ms", good.column("latency_ms").cast(pa.float32()))
    pq.write_table(retyped.replace_schema_metadata(SPEC.schema.metadata), path)
    want = f"{path}: column 'latency_ms' is float, expected double"
    with pytest.raises(SchemaError, match=re.escape(want)):
        read_table(path, SPEC)
    dropped = good.drop_columns(["is_best"])
    pq.write_table(dropped.replace_schema_metadata(SPEC.schema.metadata), path)
    with pytest.raises(SchemaError, match=re.escape(f"{path}: columns")):
        read_table(path, SPEC)


def test_a_failed_write_leaves_the_old_file_and_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    path = _written(tmp_path / "t.parquet")
    before = path.read_bytes()

    def write_half_then_die(table: pa.Table, where: Path | str, **kwargs: object) -> None:
        Path(where).write_bytes(before[: len(before) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(tables.pq, "write_table", write_half_then_die)
    new_rows = [{**ROWS[0], "report_id": "new"}]
    with pytest.raises(OSError, match="disk full"):
        write_table(path, SPEC, to_table(SPEC, new_rows))
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
    assert path.read_bytes() == before
    monkeypatch.undo()
    assert read_table(path, SPEC).to_pylist() == ROWS


def test_a_failed_first_write_leaves_no_file_at_all(tmp_path: Path, monkeypatch) -> None:
    def die(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tables.os, "replace", die)
    with pytest.raises(KeyboardInterrupt):
        write_table(tmp_path / "sub" / "t.parquet", SPEC, to_table(SPEC, ROWS))
    assert list((tmp_path / "sub").iterdir()) == []


def test_a_truncated_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = _written(tmp_path / "t.parquet")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=re.escape(str(path))):
        read_table(path, SPEC)


def test_collector_schemas_follow_naming_rules() -> None:
    for spec in (TRAJECTORIES, actions_spec(5)):
        for name, typ in spec.columns:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
            if pa.types.is_boolean(typ):
                assert name.startswith("is_"), name
    names = actions_spec(5).names
    assert len(set(names)) == len(names)
    assert len([n for n in names if n.startswith(("frontier_", "preview_", "tree_size"))]) == 10
    assert set(state_feature_names(5)) <= set(names)  # every row carries the full state z for D = 5
    assert actions_spec(5).tag != actions_spec(6).tag  # depth is part of the version
