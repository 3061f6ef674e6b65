"""The results ledger (collectors/evaluation/ledger.py): its figures, its CSV, and one row per run."""

from __future__ import annotations

import pytest
from results_artifacts import GRAFT, WALL, deployed

from collectors.evaluation.ledger import (
    COLUMNS,
    Figure,
    LedgerRow,
    add_run,
    figures_of,
    ledger_table,
    read_ledger,
    write_ledger,
)


def row(date: str, run_id: str = "", commit: str = "c" * 40, **figures: Figure) -> LedgerRow:
    return LedgerRow(date, commit, "l" * 64, run_id, "make results" if run_id else "docs/LOG.md", figures)


def test_figures_are_the_headline_tables_and_carry_an_interval_where_the_metrics_do():
    ev = {
        "deployed.priced_speedup.fitting": {**deployed(1.092, 0.992, 25), "student_gain_mean_lo": 1.05,
                                            "student_gain_mean_hi": 1.13},
        "deployed.priced_speedup.held-out_pair_and_task": deployed(1.1, 1.1, 1),
        "priced_speedup.held-out_task": deployed(2.0, 2.0, 5),  # the student's own row is not the headline
    }  # fmt: skip
    got = figures_of(ev, GRAFT, WALL)
    assert got["fitting_gain_mean"] == Figure(1.092, 1.05, 1.13)
    assert got["fitting_gain_worst"] == Figure(0.992)
    assert got["held_out_pair_and_task_gain_mean"] == Figure(1.1)
    assert "held_out_pair_and_task_gain_worst" not in got and "held_out_task_gain_mean" not in got
    assert (got["pricing_within"], got["pricing_rows"]) == (Figure(14), Figure(20))
    assert got["graft_priced_speedup"] == Figure(1.63) and got["graft_wall_speedup"] == Figure(1.72)
    assert got["graft_hindsight_speedup"] == Figure(1.51)
    assert "pricing_within" not in figures_of(ev, GRAFT, {})  # no wall_check metrics: nothing invented


def test_the_csv_reads_back_exactly():
    rows = [
        row("2026-12-08", "r" * 32, fitting_gain_mean=Figure(1 / 3, 0.25, 0.5), pricing_within=Figure(3)),
        row("2026-12-07", graft_wall_speedup=Figure(1.78)),
    ]
    text = write_ledger(rows)
    assert text.splitlines()[0] == ",".join(COLUMNS) and ",3," in text.splitlines()[1]
    assert read_ledger(text, "ledger.csv") == rows


def test_a_ledger_with_other_columns_or_a_row_without_a_commit_is_refused():
    with pytest.raises(ValueError, match=r"ledger\.csv: columns"):
        read_ledger("date,commit\n2026-12-07,abc\n", "ledger.csv")
    no_commit = write_ledger([row("2026-12-07", commit="")])
    with pytest.raises(ValueError, match=r"ledger\.csv:2: a row needs"):
        read_ledger(no_commit, "ledger.csv")


def test_a_run_is_added_once_on_top_of_its_day():
    old = [row("2026-12-07", commit="a" * 40), row("2026-12-06", commit="b" * 40)]
    new = row("2026-12-07", "r1", fitting_gain_mean=Figure(1.1))
    rows = add_run(old, new)
    assert rows == [new, *old]
    again = row("2026-12-07", "r1", fitting_gain_mean=Figure(1.2))  # the same run reported again
    assert add_run(rows, again) == [again, *old]
    earlier = row("2026-12-05", "r0")
    assert add_run(rows, earlier)[-1] == earlier  # newest first by date, wherever it was added
    imported = row("2026-12-06", commit="b" * 40, fitting_gain_mean=Figure(1.0))
    assert add_run(old, imported) == [old[0], imported]  # an imported run is its commit and lock


def test_the_table_shows_gains_intervals_counts_and_n_a():
    r = row("2026-12-08", "0123456789abcdef", fitting_gain_mean=Figure(1.092, 1.05, 1.13),
            fitting_gain_worst=Figure(0.992), pricing_within=Figure(3), pricing_rows=Figure(19),
            graft_priced_speedup=Figure(2.01, 1.9, 2.1))  # fmt: skip
    line = ledger_table([r, row("2026-12-07")]).splitlines()
    cells = [c.strip() for c in line[2].split("|")[1:-1]]
    assert cells[:6] == ["2026-12-08", "`cccccccccccc`", "`llllllllllll`", "`01234567`",
                         "+9.2% [+5.0%, +13.0%] (worst -0.8%)", "n/a"]  # fmt: skip
    assert cells[8:12] == ["n/a", "3 of 19", "2.01x [1.90, 2.10]", "n/a"]
    assert "| docs/LOG.md |" in line[3] and len(line[0].split("|")) == len(line[2].split("|"))


def test_a_runs_figures_take_the_headline_intervals_where_it_has_them():
    prefix = "deployed.priced_speedup."
    ev = {f"{prefix}fitting": {"student_gain_mean": 1.1, "student_gain_worst": 0.99},
          "headline": {"fitting": {"mean": [1.09, 1.05, 1.13], "worst": [0.995, 0.97, 1.01],
                                   "vs_adaptive": [1.08, 1.02, 1.12]}}}  # fmt: skip
    graft = {"mean_speedup": {"full": 2.0, "hindsight": 1.8}, "graft_vs_hindsight": [1.1, 1.0, 1.2]}
    got = figures_of(ev, graft, {})
    assert got["fitting_gain_mean"] == Figure(1.09, 1.05, 1.13)
    assert got["fitting_gain_worst"] == Figure(0.995, 0.97, 1.01)
    assert got["fitting_vs_adaptive_mean"] == Figure(1.08, 1.02, 1.12)
    assert got["graft_vs_hindsight"] == Figure(1.1, 1.0, 1.2) and got["graft_priced_speedup"] == Figure(2.0)
    without = figures_of({f"{prefix}fitting": ev[f"{prefix}fitting"]}, graft, {})
    assert without["fitting_gain_mean"] == Figure(1.1) and "fitting_vs_adaptive_mean" not in without
