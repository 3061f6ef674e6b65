"""Value contracts of the declared Parquet tables: what every row (and every group of rows) holds.

Contract: a `Contract` sits beside a table's columns in its `TableSpec` and states, as data,
- ``key``: the columns that identify a row (no two rows share them);
- ``nullable``: the only columns that may hold nulls (every other column holds none);
- ``non_finite``: float columns that may hold NaN (a measurement that was not taken); every other
  float column, and every element of a float list column, is finite;
- ``rules``: row rules, a polars boolean expression per rule, true where the row keeps it (ranges,
  relations between columns);
- ``groups``: group rules, an aggregated boolean per group (row counts per report, constant columns).

`first_violation` evaluates them in that order (nulls, finiteness, keys, rules, groups) and returns
the first broken one as one line naming the column, the rule, how many rows (or groups) break it and
the key of the first of them (features.tables raises it as a ContractError naming the file). A null
never passes a rule silently: the null check comes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa


class _Broken(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, eq=False)
class Rule:
    """``ok`` is true where a row keeps the rule; ``column`` is the column the error names."""

    column: str
    text: str
    ok: pl.Expr


@dataclass(frozen=True, eq=False)
class GroupRule:
    """``ok`` aggregates each group of rows sharing ``by`` to one boolean (e.g. ``pl.len() == 32``)."""

    by: tuple[str, ...]
    column: str
    text: str
    ok: pl.Expr


@dataclass(frozen=True, eq=False)
class Contract:
    key: tuple[str, ...] = ()
    nullable: frozenset[str] = frozenset()
    non_finite: frozenset[str] = frozenset()
    rules: tuple[Rule, ...] = ()
    groups: tuple[GroupRule, ...] = field(default=())


NO_CONTRACT = Contract()


def non_negative(*columns: str) -> tuple[Rule, ...]:
    return tuple(Rule(c, ">= 0", pl.col(c) >= 0) for c in columns)


def positive(*columns: str) -> tuple[Rule, ...]:
    return tuple(Rule(c, "> 0", pl.col(c) > 0) for c in columns)


def in_range(column: str, lo: float, hi: float) -> Rule:
    return Rule(column, f"in [{lo}, {hi}]", pl.col(column).is_between(lo, hi))


def elements_non_negative(*columns: str) -> tuple[Rule, ...]:
    return tuple(Rule(c, "every element >= 0", (pl.col(c).list.min().fill_null(0)) >= 0) for c in columns)


def bits_text(column: str, length: pl.Expr) -> Rule:
    """A schedule prefix/suffix: only '0' and '1', of the given length."""
    ok = pl.col(column).str.contains("^[01]*$") & (pl.col(column).str.len_chars() == length)
    return Rule(column, "a string of '0'/'1' of its step's length", ok)


def rows_per(by: Sequence[str], n: int | pl.Expr, what: str) -> GroupRule:
    count = pl.len() == n
    return GroupRule(tuple(by), by[0], f"{what} rows per {'/'.join(by)}", count)


def constant_per(by: Sequence[str], columns: Sequence[str]) -> tuple[GroupRule, ...]:
    return tuple(
        GroupRule(tuple(by), c, f"one value per {'/'.join(by)}", pl.col(c).n_unique() == 1) for c in columns
    )


def _float_columns(schema: pa.Schema) -> tuple[list[str], list[str]]:
    scalar, lists = [], []
    for f in schema:
        if pa.types.is_floating(f.type):
            scalar.append(f.name)
        elif pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type):
            lists.append(f.name)
    return scalar, lists


def _fail(frame: pl.DataFrame, bad: pl.Series, key: Sequence[str], column: str, text: str) -> None:
    """Raise _Broken for ``column`` (a name, or "a,b" for a key of several columns) if any row is bad."""
    n_bad = int(bad.sum())
    if n_bad == 0:
        return
    first = frame.filter(bad).row(0, named=True)
    example = ", ".join(f"{k}={first[k]!r}" for k in key if k in first)
    label = f"column {column!r}" if "," not in column else f"key ({column.replace(',', ', ')})"
    raise _Broken(f"{label} breaks '{text}' in {n_bad} of {frame.height} rows (first: {example})")


def first_violation(contract: Contract, table: pa.Table) -> str | None:
    """The first rule ``table`` breaks (see the module doc), None if it keeps ``contract``.
    A spec that declares no contract (NO_CONTRACT) is not value-checked at all."""
    if contract is NO_CONTRACT:
        return None
    try:
        _check(contract, table)
    except _Broken as broken:
        return broken.message
    return None


def _check(contract: Contract, table: pa.Table) -> None:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    key = list(contract.key) or frame.columns[:3]
    for name in frame.columns:
        if name not in contract.nullable:
            _fail(frame, frame[name].is_null(), key, name, "no nulls")
    scalar, lists = _float_columns(table.schema)
    for name in scalar:
        if name in contract.non_finite:
            ok = frame[name].is_nan() | frame[name].is_finite()
            _fail(frame, ~ok.fill_null(True), key, name, "finite or NaN (not measured)")
        else:
            _fail(frame, ~frame[name].is_finite().fill_null(True), key, name, "finite")
    for name in (
        f.name for f in table.schema if pa.types.is_list(f.type) and f.name not in contract.nullable
    ):
        null = frame.select(pl.col(name).list.eval(pl.element().is_null().any()).list.first()).to_series()
        _fail(frame, null.fill_null(False), key, name, "no null elements")
    for name in lists:
        finite = frame.select(pl.col(name).list.eval(pl.element().is_finite().all()).list.first()).to_series()
        _fail(frame, ~finite.fill_null(True), key, name, "every element finite")
    if contract.key:
        dup = frame.select(pl.struct(list(contract.key)).is_duplicated()).to_series()
        _fail(frame, dup, key, ",".join(contract.key), "unique key")
    for rule in contract.rules:
        ok = frame.select(rule.ok.fill_null(True)).to_series()
        _fail(frame, ~ok, key, rule.column, rule.text)
    for group in contract.groups:
        agg = frame.group_by(list(group.by), maintain_order=True).agg(group.ok.alias("__ok"))
        bad = ~agg["__ok"].fill_null(False)
        if bad.any():
            first = agg.filter(bad).row(0, named=True)
            example = ", ".join(f"{k}={first[k]!r}" for k in group.by)
            raise _Broken(
                f"column {group.column!r} breaks '{group.text}' in {int(bad.sum())} of "
                f"{agg.height} groups (first: {example})"
            )
