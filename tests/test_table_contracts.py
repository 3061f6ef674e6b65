"""Value contracts and table digests (features/contracts.py, features/tables.py), fuzzed on real-shaped
tables (tests/synthetic_collect.py, the collectors' schemas).

Two layers, asserted separately:
- the value contract refuses every mutation that leaves it: a null, NaN or inf, a negative cost or
  count, a duplicated or dropped row, a bit flip in a key, a flag, a value tied to another column
  or a value constant over a group (a report's context, a schedule's outcome);
- the sha256 that the writer records in ``tables.json`` refuses every mutation of the bytes,
  including those the contract cannot see (a mantissa bit of a free signal, a whole dropped report).
"""

from __future__ import annotations

import math
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_collect import synthetic_tables
from synthetic_rounds import synthetic_rounds

from decoder.core.state import CONTEXT_NAMES, history_names
from features.canonical import canonicalize
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.schemas import samples_spec, states_spec
from features.tables import (
    MANIFEST,
    ContractError,
    TableSpec,
    check_values,
    read_manifest,
    read_table,
    write_table,
    write_tables,
)

DEPTH = 3
OUTCOME = ("mean_accepted_length", "round_latency_ms", "throughput_tok_per_s")
# columns where any change of one value breaks a rule: a range, a key, a relation or a group constant
MUST_REFUSE = {
    "actions": {"schedule_id", "step", "is_invoke", "step_frac", "called_step_1", "called_step_2"}
    | set(OUTCOME)
    | set(CONTEXT_NAMES),
    "trajectories": {"schedule_id", "n_prompts", "n_rounds", "n_mid_calls", "mid_tokens", "verified_nodes"},
    "rounds": {
        "prompt_id",
        "prompt_tokens",
        "start_position",
        "mid_lag",
        "schedule_id",
        "accepted",
        "n_small_steps",
        "throughput_tok_per_s",
        "decision_ms",
        "decision_cold_ms",
        "is_round_best",
    },
}
NON_NEGATIVE = {
    "actions": {"target_ms", "mid_ms", "log_prompt_tokens", "log_mid_lag", "frontier_size", *OUTCOME},
    "trajectories": {"n_tokens", "n_small_steps", "mid_catch_up_tokens", "tokens_per_round", *OUTCOME},
    "rounds": {
        "verified_nodes",
        "prompt_blocks",
        "round_latency_ms",
        "catch_up_ms",
        "decision_ms",
        "decision_cold_ms",
    },
}


@cache
def tables() -> dict[str, tuple[TableSpec, pa.Table]]:
    actions, trajectories = synthetic_tables(n_reports=4, depth=DEPTH, seed=0)
    rounds = synthetic_rounds(actions, trajectories, DEPTH, seed=0, n_prompts=1, n_starts=2)
    return {
        "actions": (actions_spec(DEPTH), actions),
        "trajectories": (TRAJECTORIES, trajectories),
        "rounds": (rounds_spec(DEPTH), rounds),
    }


def _scalar_columns(name: str, numeric_only: bool = False) -> list[str]:
    spec, _ = tables()[name]
    ok = (pa.types.is_integer, pa.types.is_floating) + (() if numeric_only else (pa.types.is_boolean,))
    return [n for n, t in spec.columns if any(f(t) for f in ok)]


def _write_raw(path: Path, spec: TableSpec, table: pa.Table) -> None:
    """What an editor or a corruption leaves: valid Parquet with the spec's tag, no checks."""
    pq.write_table(table.replace_schema_metadata(spec.schema.metadata), path)


def _with_value(table: pa.Table, column: str, row: int, value: object) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, type=table.schema.field(i).type))


def _flip(table: pa.Table, column: str, row: int, bit: int) -> tuple[pa.Table, object]:
    """Flip one bit of one stored value; returns the table and the new value."""
    typ = table.schema.field(column).type
    if pa.types.is_boolean(typ):
        new = not table.column(column)[row].as_py()
        return _with_value(table, column, row, new), new
    values = table.column(column).to_numpy().copy()
    raw = values.view(f"u{values.dtype.itemsize}")
    raw[row] ^= np.array(1 << (bit % (8 * values.dtype.itemsize))).astype(raw.dtype)
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, type=typ)), values[row].item()


def _refused_by_contract(spec: TableSpec, table: pa.Table, path: Path, *names: str) -> str:
    _write_raw(path, spec, table)
    with pytest.raises(ContractError) as err:
        read_table(path, spec)
    message = str(err.value)
    assert str(path) in message and "breaks" in message and (" rows " in message or " groups " in message)
    for name in names:
        assert repr(name) in message, message
    return message


def _refused_by_digest(spec: TableSpec, table: pa.Table, folder: Path, name: str) -> None:
    """Written in place of the recorded file (tables.json unchanged): the sha256 refuses it."""
    write_tables(folder, {name: tables()[name]})
    path = folder / f"{name}.parquet"
    _write_raw(path, spec, table)
    with pytest.raises(ContractError, match="sha256 differs"):
        read_table(path, spec)


def test_valid_tables_round_trip_through_the_manifest(tmp_path: Path) -> None:
    write_tables(tmp_path, tables())
    recorded = read_manifest(tmp_path)
    assert sorted(recorded) == ["actions.parquet", "rounds.parquet", "trajectories.parquet"]
    for name, (spec, table) in tables().items():
        back = read_table(tmp_path / f"{name}.parquet", spec)
        assert pl.from_arrow(back).equals(pl.from_arrow(table))  # NaN (not measured) equals NaN here


def test_a_null_target_ms_is_refused_naming_file_column_rule_and_key(tmp_path: Path) -> None:
    spec, actions = tables()["actions"]
    message = _refused_by_contract(spec, _with_value(actions, "target_ms", 5, None), tmp_path / "a.parquet")
    assert "column 'target_ms' breaks 'no nulls' in 1 of 96 rows" in message
    assert "report_id='pair0/ds0', schedule_id=1, step=3" in message


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("mean_accepted_length", -0.5, ">= 0"),
        ("mean_accepted_length", math.nan, "finite"),
        ("throughput_tok_per_s", -math.inf, "finite"),
        ("round_latency_ms", 0.0, "> 0"),
        ("schedule_id", 8, "in [0, 7]"),
        ("step", 0, "in [1, 3]"),
        ("frontier_leaf_ratio", 1.5, "in [0, 1]"),
    ],
)
def test_out_of_contract_values_are_refused(tmp_path: Path, column: str, value: object, rule: str) -> None:
    spec, actions = tables()["actions"]
    message = _refused_by_contract(
        spec, _with_value(actions, column, 7, value), tmp_path / "a.parquet", column
    )
    assert f"breaks '{rule}'" in message


def test_duplicated_table_and_dropped_row_are_refused(tmp_path: Path) -> None:
    spec, actions = tables()["actions"]
    path = tmp_path / "a.parquet"
    assert "unique key" in _refused_by_contract(spec, pa.concat_tables([actions, actions]), path)
    message = _refused_by_contract(spec, actions.slice(1), path)
    assert "'2^D x D = 24 rows per report_id' in 1 of 4 groups (first: report_id='pair0/ds0')" in message


def test_a_dropped_report_keeps_the_contract_but_not_the_digest(tmp_path: Path) -> None:
    spec, actions = tables()["actions"]
    fewer = pl.from_arrow(actions).filter(pl.col("report_id") != "pair1/ds0").to_arrow().cast(spec.schema)
    check_values(spec, fewer, "fewer")  # a consistent table of 3 reports: only the digest knows
    _refused_by_digest(spec, fewer, tmp_path, "actions")


def test_write_table_refuses_a_broken_table_and_leaves_nothing(tmp_path: Path) -> None:
    spec, actions = tables()["actions"]
    with pytest.raises(ContractError, match="'mid_ms' breaks 'no nulls'"):
        write_table(tmp_path / "a.parquet", spec, _with_value(actions, "mid_ms", 0, None))
    assert list(tmp_path.iterdir()) == []


def test_rewriting_a_recorded_table_updates_its_digest(tmp_path: Path) -> None:
    write_tables(tmp_path, tables())
    spec, actions = tables()["actions"]
    before = read_manifest(tmp_path)
    write_table(tmp_path / "actions.parquet", spec, actions.slice(0, 24))  # one report: a valid table
    after = read_manifest(tmp_path)
    assert after["actions.parquet"] != before["actions.parquet"]
    assert after["rounds.parquet"] == before["rounds.parquet"]
    assert read_table(tmp_path / "actions.parquet", spec).num_rows == 24


def test_a_malformed_manifest_is_refused(tmp_path: Path) -> None:
    write_tables(tmp_path, tables())
    (tmp_path / MANIFEST).write_text('{"actions.parquet": "abc"}')
    with pytest.raises(ContractError, match=r"tables.json: expected an object \{file: sha256 hex\}"):
        read_table(tmp_path / "actions.parquet", tables()["actions"][0])


def test_canonical_tables_keep_their_contracts() -> None:
    _, actions = tables()["actions"]
    out = canonicalize(actions, DEPTH, 2)
    check_values(states_spec(DEPTH), out.states, "states")
    check_values(samples_spec(DEPTH), out.samples, "samples")
    dropped = pl.from_arrow(out.states).slice(1).to_arrow().cast(states_spec(DEPTH).schema)
    with pytest.raises(ContractError, match="'state_id' breaks 'the row index'"):
        check_values(states_spec(DEPTH), dropped, "states")


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_every_single_bit_flip_is_refused(data: st.DataObject) -> None:
    """Contract layer where the flipped value leaves the contract; digest layer always."""
    name = data.draw(st.sampled_from(sorted(tables())))
    spec, table = tables()[name]
    column = data.draw(st.sampled_from(_scalar_columns(name)))
    row = data.draw(st.integers(0, table.num_rows - 1))
    bit = data.draw(st.integers(0, 63))
    flipped, new = _flip(table, column, row, bit)
    old = table.column(column)[row].as_py()
    is_float = isinstance(new, float)
    nan_ok = column in spec.contract.non_finite
    must = (
        column in MUST_REFUSE[name]
        or (is_float and not math.isfinite(new) and not (math.isnan(new) and nan_ok))
        or (column in NON_NEGATIVE[name] and not (is_float and math.isnan(new)) and new < 0)
    )
    # a flip that leaves the value equal (the sign bit of 0.0: -0.0 == 0.0), or moves it by less than
    # the contracts' float tolerance (1e-12, step_frac = k/D), is for the digest alone to see
    close = is_float and math.isfinite(new) and math.isfinite(old) and abs(new - old) <= 1e-12
    same = new == old or close
    if must and not same and not (nan_ok and math.isnan(old)):
        with pytest.raises(
            ContractError,
            match=r"^flipped: \S+ (column '\w+'|key \([\w, ]+\)) breaks '.+' in \d+ of \d+ (rows|groups) "
            r"\(first: ",
        ):
            check_values(spec, flipped, "flipped")
    with tempfile.TemporaryDirectory() as folder:
        _refused_by_digest(spec, flipped, Path(folder), name)


@FUZZ
@given(data=st.data())
def test_every_out_of_contract_value_is_refused(data: st.DataObject) -> None:
    """Nulls anywhere, NaN or inf in a float, a negative cost or count, a repeated or lost row."""
    name = data.draw(st.sampled_from(sorted(tables())))
    spec, table = tables()[name]
    row = data.draw(st.integers(0, table.num_rows - 1))
    kind = data.draw(st.sampled_from(["null", "nan", "inf", "negative", "duplicate", "drop"]))
    floats = [
        n for n in _scalar_columns(name, numeric_only=True) if pa.types.is_floating(spec.schema.field(n).type)
    ]
    column = None
    if kind == "null":
        column = data.draw(st.sampled_from(spec.names))
        mutated = _with_value(table, column, row, None)
    elif kind in ("nan", "inf"):
        column = data.draw(
            st.sampled_from([n for n in floats if not (kind == "nan" and n in spec.contract.non_finite)])
        )
        mutated = _with_value(
            table,
            column,
            row,
            math.nan if kind == "nan" else data.draw(st.sampled_from([math.inf, -math.inf])),
        )
    elif kind == "negative":
        column = data.draw(st.sampled_from(sorted(NON_NEGATIVE[name])))
        mutated = _with_value(
            table, column, row, -1 if column not in floats else -data.draw(st.floats(1e-9, 1e9))
        )
    elif kind == "duplicate":
        mutated = pa.concat_tables([table.slice(0, row + 1), table.slice(row)])
    else:
        mutated = pa.concat_tables([table.slice(0, row), table.slice(row + 1)])
    with pytest.raises(ContractError) as err:
        check_values(spec, mutated, f"{name}.parquet")
    message = str(err.value)
    assert message.startswith(f"{name}.parquet: ") and "(first: " in message
    if column is not None:
        assert f"column {column!r}" in message, message


def test_history_features_are_named_as_the_contract_expects() -> None:
    assert history_names(DEPTH)[2:4] == ("called_step_1", "called_step_2")
