"""Fold assignments of the learning stages, stated explicitly (one fold id per report).

Two splits, both grouped by report (all canonical states of a report share its fold):

- ``report`` (the cross-fitting split every stage reuses, stored as ``fold_id``): a Latin square
  over the (pair, dataset) grid, fold = (pair index + dataset index) mod k with pairs and datasets
  in sorted order and k = min(n_folds, n_reports), at least 3 reports. Each pair's reports land in
  different folds and so do each dataset's, so a held-out fold is "new reports of known pairs and
  known tasks".
  (scikit-learn's GroupKFold over sorted report ids put one dataset in each fold: leave one
  dataset out by accident.) When the grid is too small to fill k folds, the reports, ordered by
  that Latin value, are dealt round-robin instead.
- ``pair`` (leave one pair out, the held-out pair story): fold = index of the report's pair in
  sorted order. It exists only with at least 2 pairs: a bring-your-own-pair run of one pair has
  the ``report`` split alone (its reports are that pair's datasets), see :func:`splits_of`.

:func:`fold_rows` turns either split into a per-row array for any table with ``report_id`` and
``pair_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

log = logging.getLogger(__name__)

SPLITS = ("report", "pair")
# An outer fold held out and an inner one held out of the rest must leave a fold to train on.
MIN_REPORTS = 3


def report_folds(
    report_ids: Sequence[str], pair_ids: Sequence[str], dataset_ids: Sequence[str], n_folds: int
) -> dict[str, int]:
    """report_id -> fold id in [0, min(n_folds, n_reports)); see the module docstring."""
    origin = dict(zip(report_ids, zip(pair_ids, dataset_ids, strict=True), strict=True))
    reports = sorted(origin)
    if len(reports) < MIN_REPORTS:
        raise ValueError(
            f"grouped folds need at least {MIN_REPORTS} reports (pair x dataset cells), got "
            f"{len(reports)}: the students pick thresholds in folds nested inside each outer fold; "
            "with one pair, give its prompts at least 3 categories (each category is a dataset)"
        )
    k = min(n_folds, len(reports))
    pairs = {p: i for i, p in enumerate(sorted({p for p, _ in origin.values()}))}
    datasets = {d: i for i, d in enumerate(sorted({d for _, d in origin.values()}))}
    latin = {r: (pairs[origin[r][0]] + datasets[origin[r][1]]) % k for r in reports}
    if len(set(latin.values())) == k:
        return latin
    order = sorted(reports, key=lambda r: (latin[r], pairs[origin[r][0]], datasets[origin[r][1]]))
    return {r: i % k for i, r in enumerate(order)}


def pair_folds(pair_ids: Sequence[str]) -> dict[str, int]:
    """pair_id -> fold id (sorted order): one fold per pair."""
    pairs = sorted(set(pair_ids))
    if len(pairs) < 2:
        raise ValueError(f"leave-one-pair-out needs at least 2 pairs, got {len(pairs)}")
    return {p: i for i, p in enumerate(pairs)}


def has_pair_split(pair_ids: Sequence[str]) -> bool:
    """Whether leave-one-pair-out is defined: at least 2 distinct pairs."""
    return len(set(pair_ids)) >= 2


def splits_of(pair_ids: Sequence[str]) -> tuple[str, ...]:
    """The splits this data supports: both, or ``report`` alone for one pair (logged once per call)."""
    if has_pair_split(pair_ids):
        return SPLITS
    log.info("one pair (%s): no leave-one-pair-out split; report folds only", sorted(set(pair_ids)))
    return ("report",)


def fold_rows(table: pa.Table, split: str) -> np.ndarray:
    """Per-row fold ids of ``split`` for a table with report_id, pair_id and fold_id columns."""
    if split == "report":
        return table.column("fold_id").to_numpy().astype(np.int64)
    if split == "pair":
        pairs = table.column("pair_id").to_pylist()
        folds = pair_folds(pairs)
        return np.array([folds[p] for p in pairs], dtype=np.int64)
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def fold_table(states: pa.Table) -> list[dict[str, object]]:
    """One row per report: its pair, dataset and fold in both splits (the explicit assignment);
    ``pair_fold`` is None for every report when there is one pair (no leave-one-pair-out split)."""
    frame = pl.from_arrow(states.select(["report_id", "pair_id", "dataset_id", "fold_id"])).unique(
        maintain_order=True
    )
    pair_ids = frame["pair_id"].to_list()
    pairs = pair_folds(pair_ids) if has_pair_split(pair_ids) else dict.fromkeys(pair_ids)
    return [
        {
            "report_id": row["report_id"],
            "pair_id": row["pair_id"],
            "dataset_id": row["dataset_id"],
            "report_fold": int(row["fold_id"]),
            "pair_fold": pairs[row["pair_id"]],
        }
        for row in frame.sort("report_id").iter_rows(named=True)
    ]
