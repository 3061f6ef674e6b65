"""Canonical states: action rows with the same (report, step k, prefix a_<k) are one online state.

Contract:
- :func:`merge_states` is order-independent (any permutation of the rows gives bit-identical
  output: each group's weighted sum runs over its values in sorted order) and idempotent (merging
  its own output changes nothing: a group of one row is copied, not recomputed). Features are the
  weighted mean over the merged rows, weights (row counts) add up.
- folds are grouped by report and stated explicitly: features.folds.report_folds (a Latin square
  over pairs x datasets, so no fold is one dataset or one pair).
- :func:`canonicalize` turns the collectors' ``actions`` table into the ``states`` and ``samples``
  tables of features/schemas.py and checks there are exactly 2^D - 1 states per report.

The grouping, joins and sorts are polars expressions; tables cross in and out through Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from decoder.core.state import state_feature_names
from features.collect_schemas import actions_spec
from features.folds import report_folds
from features.schemas import samples_spec, states_spec
from features.tables import SchemaError, TableSpec

StateKey = tuple[str, int, str]  # (report_id, step, prefix)
KEY = ("report_id", "step", "prefix")
_WEIGHT = "n_rows"


@dataclass(frozen=True)
class Merged:
    keys: list[StateKey]  # sorted
    features: np.ndarray  # (n_states, n_features) float64
    weights: np.ndarray  # (n_states,) int64 rows merged


def merge_frame(frame: pl.DataFrame, names: Sequence[str]) -> pl.DataFrame:
    """One row per KEY, sorted by KEY: ``n_rows`` summed, ``names`` the n_rows-weighted means."""
    weight = pl.col(_WEIGHT).cast(pl.Float64)
    # Sorting each group's products fixes the summation order, whatever the input row order.
    means = [
        pl.when(pl.len() > 1)
        .then((pl.col(n) * weight).sort().sum() / pl.col(_WEIGHT).sum())
        .otherwise(pl.col(n).first())
        .alias(n)
        for n in names
    ]
    return frame.group_by(KEY).agg(pl.col(_WEIGHT).sum(), *means).sort(KEY)


def merge_states(keys: Sequence[StateKey], features: np.ndarray, weights: np.ndarray | None = None) -> Merged:
    """Weighted mean of the feature rows per key, keys sorted; see the module contract."""
    features = np.asarray(features, dtype=np.float64).reshape(len(keys), -1)
    weights = np.ones(len(keys), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    names = [f"f{j}" for j in range(features.shape[1])]
    frame = pl.DataFrame(
        {
            "report_id": pl.Series([str(k[0]) for k in keys], dtype=pl.String),
            "step": pl.Series([int(k[1]) for k in keys], dtype=pl.Int64),
            "prefix": pl.Series([str(k[2]) for k in keys], dtype=pl.String),
            _WEIGHT: pl.Series(weights, dtype=pl.Int64),
            **{n: pl.Series(features[:, j], dtype=pl.Float64) for j, n in enumerate(names)},
        }
    )
    merged = merge_frame(frame, names)
    return Merged(
        list(merged.select(KEY).iter_rows()),
        merged.select(names).to_numpy().astype(np.float64).reshape(merged.height, len(names)),
        merged[_WEIGHT].to_numpy().astype(np.int64),
    )


def check_complete(states: pl.DataFrame, depth: int) -> None:
    """Every report must have exactly one state per (k, prefix of k-1 bits): 2^D - 1 states."""
    want = pl.DataFrame(
        [
            (k, format(p, f"0{k - 1}b") if k > 1 else "")
            for k in range(1, depth + 1)
            for p in range(2 ** (k - 1))
        ],
        schema={"step": pl.Int64, "prefix": pl.String},
        orient="row",
    )
    got = states.select(KEY).unique().with_columns(pl.col("step").cast(pl.Int64))
    expected = got.select("report_id").unique().join(want, how="cross")
    missing = expected.join(got, on=KEY, how="anti")
    extra = got.join(expected, on=KEY, how="anti")
    for report in sorted(set(missing["report_id"]) | set(extra["report_id"])):
        raise ValueError(
            f"report {report!r}: {_of(got, report).height} canonical states, expected {want.height} "
            f"(2^D - 1); missing e.g. {_first(missing, report)}, unexpected e.g. {_first(extra, report)}"
        )


def _of(frame: pl.DataFrame, report: str) -> pl.DataFrame:
    return frame.filter(pl.col("report_id") == report)


def _first(frame: pl.DataFrame, report: str) -> list[tuple[int, str]]:
    return list(_of(frame, report).sort("step", "prefix").head(3).select("step", "prefix").iter_rows())


@dataclass(frozen=True)
class CanonicalTables:
    states: pa.Table
    samples: pa.Table


def _lookup(left: pl.DataFrame, right: pl.DataFrame, on: Sequence[str]) -> pl.DataFrame:
    """``left`` with ``right``'s columns joined on ``on``, in ``left``'s row order."""
    return left.with_row_index("_row").join(right, on=on, how="left").sort("_row").drop("_row")


def _arrow(frame: pl.DataFrame, spec: TableSpec) -> pa.Table:
    return frame.select(spec.names).to_arrow().cast(spec.schema)


def canonicalize(actions: pa.Table, depth: int, n_folds: int) -> CanonicalTables:
    """The states and samples tables from the collectors' actions table (any row order)."""
    if actions.schema.names != actions_spec(depth).names:
        raise SchemaError(f"actions table does not match {actions_spec(depth).tag}")
    frame = pl.from_arrow(actions)
    origin = frame.select("report_id", "pair_id", "dataset_id").unique()
    mixed = origin.filter(pl.col("report_id").is_duplicated())["report_id"].unique().sort()
    if len(mixed):
        raise ValueError(f"actions: report(s) {mixed.to_list()[:3]} span more than one pair or dataset")
    merged = merge_frame(frame.with_columns(pl.lit(1, pl.Int64).alias(_WEIGHT)), state_feature_names(depth))
    check_complete(merged, depth)
    folds = report_folds(*(origin[c].to_list() for c in ("report_id", "pair_id", "dataset_id")), n_folds)
    fold_of = pl.DataFrame(
        {"report_id": list(folds), "fold_id": list(folds.values())},
        schema={"report_id": pl.String, "fold_id": pl.Int64},
    )
    states = _lookup(
        _lookup(merged.with_row_index("state_id"), origin, ["report_id"]), fold_of, ["report_id"]
    )
    samples = _lookup(
        frame.sort([*KEY, "schedule_id"], maintain_order=True),
        states.select(*KEY, "state_id", "fold_id"),
        KEY,
    )
    return CanonicalTables(_arrow(states, states_spec(depth)), _arrow(samples, samples_spec(depth)))
