"""The margins stage's bookkeeping: the margins table keeps the states' keys and rows; CSV plot rows."""

from __future__ import annotations

import numpy as np
from synthetic_collect import synthetic_tables

from decoder.deploy.planning import BranchSearch
from features.canonical import canonicalize
from features.schemas import margins_spec
from models.margins import OracleMargins
from pipeline.margins import margins_table, plot_rows


def test_margins_table_rows_follow_the_states():
    states = canonicalize(synthetic_tables(n_reports=3, depth=5, seed=2)[0], 5, 3).states
    n, rng = states.num_rows, np.random.default_rng(1)
    search = BranchSearch(
        rng.normal(size=n), rng.normal(size=n), [f"{i % 7:04b}" for i in range(n)], ["1"] * n
    )
    by_fold, oof = rng.normal(size=(n, 3)), rng.normal(size=n)
    oracle = OracleMargins(rng.normal(size=n), rng.normal(size=n))
    spec = margins_spec(5)
    table = margins_table(states, search, oof, by_fold, oracle, spec)
    assert table.schema.equals(spec.schema)
    for key in ("report_id", "state_id", "fold_id", "step", "prefix"):
        assert table.column(key).equals(states.column(key))
    assert table.column("margin_value_by_fold_tok_per_s").to_pylist() == by_fold.tolist()
    assert table.column("value_invoke_suffix").to_pylist() == search.invoke_suffix
    assert np.array_equal(table.column("margin_value_tok_per_s").to_numpy(), search.invoke - search.skip)
    assert np.array_equal(table.column("margin_oracle_tok_per_s").to_numpy(), oracle.invoke - oracle.skip)


def test_plot_rows_number_the_states():
    rows = plot_rows(np.array([1, 2, 2]), np.array([0.5, -1.0, 2.0]), np.array([1.0, 0.0, -3.0]))
    assert rows == [
        {"state_id": 0, "step": 1, "margin_value": 0.5, "margin_oracle": 1.0},
        {"state_id": 1, "step": 2, "margin_value": -1.0, "margin_oracle": 0.0},
        {"state_id": 2, "step": 2, "margin_value": 2.0, "margin_oracle": -3.0},
    ]
    assert all(type(v) in (int, float) for r in rows for v in r.values())
