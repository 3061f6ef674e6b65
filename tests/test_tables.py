"""Declared Parquet tables: exact columns and types on write and read, atomic files, versions."""

from __future__ import annotations

import pyarrow as pa
import pytest

from features.collect_schemas import TRAJECTORIES, actions_spec
from features.tables import SchemaError, TableSpec, read_table, to_table, write_table

SPEC = TableSpec(
    "demo", "v1", (("report_id", pa.string()), ("latency_ms", pa.float64()), ("n", pa.list_(pa.int32())))
)


def test_round_trip_and_no_temp_files(tmp_path):
    table = to_table(SPEC, [{"report_id": "a", "latency_ms": 1.5, "n": [1, 2]}])
    write_table(tmp_path / "t.parquet", SPEC, table)
    assert read_table(tmp_path / "t.parquet", SPEC).to_pylist() == [
        {"report_id": "a", "latency_ms": 1.5, "n": [1, 2]}
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_rows_with_wrong_columns_or_types_are_refused():
    with pytest.raises(SchemaError, match="missing \\['n'\\]"):
        to_table(SPEC, [{"report_id": "a", "latency_ms": 1.0}])
    with pytest.raises(SchemaError, match="unexpected columns \\['extra'\\]"):
        to_table(SPEC, [{"report_id": "a", "latency_ms": 1.0, "n": [], "extra": 1}])
    with pytest.raises(SchemaError, match="demo/v1"):
        to_table(SPEC, [{"report_id": "a", "latency_ms": "slow", "n": []}])


def test_reading_another_version_or_a_changed_file_names_the_file(tmp_path):
    path = tmp_path / "t.parquet"
    write_table(path, SPEC, to_table(SPEC, [{"report_id": "a", "latency_ms": 1.0, "n": []}]))
    v2 = TableSpec("demo", "v2", SPEC.columns)
    with pytest.raises(SchemaError, match=f"{path}: written as 'demo/v1', this code reads 'demo/v2'"):
        read_table(path, v2)
    with pytest.raises(FileNotFoundError, match="no such table"):
        read_table(tmp_path / "missing.parquet", SPEC)


def test_collector_schemas_follow_naming_rules():
    for spec in (TRAJECTORIES, actions_spec(5)):
        for name, _ in spec.columns:
            assert name == name.lower() and " " not in name
    names = actions_spec(5).names
    assert len([n for n in names if n.startswith(("frontier_", "preview_", "tree_size"))]) == 10
    assert "called_step_5" in names and "called_step_6" not in names
