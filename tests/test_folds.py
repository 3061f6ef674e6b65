"""Fold assignment: grouped by report, balanced over pairs and datasets, stated per report."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from features.folds import SPLITS, fold_rows, fold_table, pair_folds, report_folds, splits_of


def _grid(n_pairs: int, n_datasets: int) -> tuple[list[str], list[str], list[str]]:
    cells = [(f"p{p}", f"d{d}") for p in range(n_pairs) for d in range(n_datasets)]
    return [f"{p}/{d}" for p, d in cells], [p for p, _ in cells], [d for _, d in cells]


def test_design_grid_is_a_latin_square_not_leave_one_dataset_out():
    reports, pairs, datasets = _grid(6, 5)
    folds = report_folds(reports, pairs, datasets, 5)
    assert sorted(set(folds.values())) == [0, 1, 2, 3, 4]
    by_pair, by_dataset, members = defaultdict(list), defaultdict(list), defaultdict(set)
    for r, p, d in zip(reports, pairs, datasets, strict=True):
        by_pair[p].append(folds[r])
        by_dataset[d].append(folds[r])
        members[folds[r]] |= {p, d}
    assert all(len(set(f)) == 5 for f in by_pair.values())  # a pair's 5 reports: 5 different folds
    assert all(len(set(f)) == 5 for f in by_dataset.values())  # a dataset's 6 reports span all folds
    assert all(len(m) >= 10 for m in members.values())  # every fold mixes >= 5 pairs and 5 datasets


def test_assignment_is_order_independent_and_fills_small_grids():
    reports, pairs, datasets = _grid(3, 2)
    folds = report_folds(reports, pairs, datasets, 5)
    assert sorted(set(folds.values())) == [0, 1, 2, 3, 4]
    rows = list(zip(reports, pairs, datasets, strict=True))
    random.Random(0).shuffle(rows)
    assert report_folds(*map(list, zip(*rows, strict=True)), 5) == folds
    with pytest.raises(ValueError):
        report_folds(["a"], ["p"], ["d"], 5)


def test_fold_columns():
    table = pa.table(
        {
            "report_id": ["p0/d0", "p0/d0", "p1/d0", "p1/d1"],
            "pair_id": ["p0", "p0", "p1", "p1"],
            "fold_id": pa.array([2, 2, 0, 1], pa.int8()),
        }
    )
    np.testing.assert_array_equal(fold_rows(table, "report"), [2, 2, 0, 1])
    np.testing.assert_array_equal(fold_rows(table, "pair"), [0, 0, 1, 1])
    assert pair_folds(["b", "a", "b"]) == {"a": 0, "b": 1}


def test_one_pair_has_report_folds_over_its_datasets_and_no_pair_split():
    reports, pairs, datasets = _grid(1, 4)
    folds = report_folds(reports, pairs, datasets, 5)
    assert sorted(folds.values()) == [0, 1, 2, 3]  # each dataset its own fold
    assert splits_of(pairs) == ("report",) and splits_of(["a", "b"]) == SPLITS
    states = pa.table({"report_id": reports, "pair_id": pairs, "dataset_id": datasets,
                       "fold_id": [folds[r] for r in reports]})  # fmt: skip
    rows = fold_table(states)
    assert [r["pair_fold"] for r in rows] == [None] * 4
    assert [r["report_fold"] for r in rows] == [folds[r] for r in sorted(reports)]
    with pytest.raises(ValueError, match="at least 2 pairs"):
        fold_rows(states, "pair")


def test_two_reports_are_refused_naming_the_category_fix():
    with pytest.raises(ValueError, match=r"at least 3 reports .* at least 3 categories"):
        report_folds(*_grid(1, 2), 5)
