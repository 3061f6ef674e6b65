"""`make results`: only the marked section of the README is rewritten."""

from __future__ import annotations

import pytest

from pipeline.readme import (
    END,
    START,
    gains_line,
    graft_checks_line,
    half_split_line,
    learned_budget_line,
    pricing_line,
    student_table,
    update,
)


def test_update_replaces_only_the_marked_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\nintro\n{START}\nold\n{END}\ntail\n")
    update(readme, f"{START}\nnew\n{END}")
    assert readme.read_text() == f"# T\nintro\n{START}\nnew\n{END}\ntail\n"
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        update(readme, "x")


def test_gains_line():
    stats = {"student_gain_mean": 1.05, "student_gain_best": 1.2, "student_gain_worst": 0.9, "n_cells": 3}
    line = gains_line({"speedup.held-out_task": stats, "mean_speedup": {}}, "speedup")
    assert "held-out task (3 cells): mean +5.0%, best +20.0%, worst -10.0%" in line
    assert "wall clock" in line
    priced = {**stats, "student_at_least_best_fixed": 0.5}
    line = gains_line({"priced_speedup.fitting": priced, "speedup.fitting": stats})
    assert line.count("cells)") == 1 and "priced" in line and ">= best fixed on 50% of cells" in line


def graft_cell(pair: str, dataset: str, graft: float, hindsight: float, learned: float = 1.0) -> dict:
    row = {"mean_accepted": 1.5, "mismatch_rate": 0.2, "tree_size": 8.0, "budget": 8}
    rows = {"graft": {**row, "speedup": graft}, "hindsight": {**row, "speedup": hindsight},
            "full": {**row, "speedup": learned}}  # fmt: skip
    return {"pair_id": pair, "dataset_id": dataset, "rows": rows}


def test_student_table_puts_the_evaluate_students_cell_beside_graft_and_n_a_where_it_has_none():
    cells = [graft_cell("zoo-m", "alpaca", 1.25, 1.5, 1.75), graft_cell("zoo-m", "pydoc", 2.0, 2.5)]
    main = [
        {"pair_id": "zoo-m", "dataset_id": "alpaca", "method": "student", "priced_speedup": 1.75,
         "mean_accepted_length": 2.5},
        {"pair_id": "zoo-m", "dataset_id": "pydoc", "method": "all-small", "priced_speedup": 9.0,
         "mean_accepted_length": 9.0},
    ]  # fmt: skip
    lines = student_table(cells, main).splitlines()
    assert (
        lines[2] == "| zoo-m | alpaca | 1.75x (A 2.50) | 1.25x (A 1.50) | 1.75x (A 1.50) | 1.50x (A 1.50) |"
    )
    assert lines[3].startswith("| zoo-m | pydoc | n/a | 2.00x")  # another method's row is not the student's


def test_graft_checks_line():
    metrics = {"n_cells": 12, "graft_at_least_hindsight": 0.25, "full_graft_at_least_hindsight": 0.5,
               "graft_rule_at_least_hindsight": 1 / 3,
               "learned_at_least_saba_on_mean": True, "full_graft_at_least_saba_graft_on_mean": False,
               "tdes_raises_a": 0.5, "tdes_keeps_or_raises_a": 0.75, "tdes_raises_a_at_learned_budget": 0.25,
               "max_overhead_ms": 0.21}  # fmt: skip
    line = graft_checks_line(metrics)
    assert "12 cells" in line
    assert "hindsight on 50% (GRAFT with SABA's budget on 25%, TDES + the per-round rule on 33%)" in line
    assert "learned B >= SABA's rule on the mean (with TDES: <)" in line
    assert "on 50% at the fixed B (keeps or raises it on 75%) and on 25% at TDES's learned B" in line
    assert "at most 0.210 ms" in line


def test_learned_budget_line_names_each_pairs_budgets():
    pairs = {"zoo-m": {"learned_budget": {"plain": {"budget": 12}, "tdes": {"budget": 9}}},
             "zoo-chat-l": {"learned_budget": {"plain": {"budget": 6}, "tdes": {"budget": 7}}}}  # fmt: skip
    line = learned_budget_line({"pairs": pairs, "mean_speedup": {"learned": 1.5, "saba": 1.25}})
    assert "zoo-chat-l B = 6 (TDES: 7); zoo-m B = 12 (TDES: 9)" in line
    assert "learned 1.50x, saba 1.25x" in line


def test_learned_budget_line_says_which_budget_full_graft_uses():
    tdes = {"budget": 9, "use_rule": False, "oof_speedup_rule": 1.01, "oof_speedup_fixed": 1.04,
            "rule": {"cap": 16}}  # fmt: skip
    pairs = {"zoo-m": {"learned_budget": {"plain": {"budget": 12}, "tdes": tdes}}}
    metrics = {"pairs": pairs, "mean_speedup": {"full": 1.5}, "mean_wall_speedup": {"full": 1.25}}
    line = learned_budget_line(metrics)
    assert (
        "zoo-m cap 16, 1.010x vs fixed B 1.040x, full GRAFT chosen once for all tasks uses the fixed B"
        in line
    )
    assert "Mean wall-clock speedup: full 1.25x" in line


def test_learned_budget_line_says_whether_full_graft_chose_per_task():
    arms = {"alpaca": {"budget": 16, "tdes": True, "rule": False},
            "gsm8k": {"budget": 8, "tdes": False, "rule": False},
            "sum": {"budget": 16, "tdes": True, "rule": True}}  # fmt: skip
    task = {"arms": arms, "use": True, "left_out_speedup": 1.4, "left_out_speedup_pooled": 1.39}
    once = {**task, "use": False, "left_out_speedup": 1.7, "left_out_speedup_pooled": 1.8}
    pairs = {name: {"learned_budget": {"plain": {"budget": 9}, "tdes": {"budget": 10}, "per_task": t}}
             for name, t in (("zoo-m", task), ("zoo-x", once))}  # fmt: skip
    line = learned_budget_line({"pairs": pairs, "mean_speedup": {"full": 1.5}})
    assert (
        "zoo-m 1.400x per task vs 1.390x once, per task (alpaca: B = 16 + TDES, gsm8k: B = 8 without TDES, "
        "sum: per-round rule (cap 16) + TDES)" in line
    )
    assert "zoo-x 1.700x per task vs 1.800x once, chosen once" in line


def test_pricing_line_sets_both_profiles_and_the_drift_side_by_side():
    metrics = {
        "pricing_agreement": {
            "stage": {"rows": 108, "within": 79, "min": 0.79, "median": 1.02, "max": 1.28},
            "beside": {"rows": 108, "within": 101, "min": 0.88, "median": 0.99, "max": 1.12},
        },
        "profile_drift": {"zoo-l": {"verify": 0.8, "mid": 0.91}},
    }
    line = pricing_line(metrics)
    assert "(the prices of every table above) on 79 of 108 rows (median 1.02, 0.79-1.28)" in line
    assert "profiled again just before its wall-clock cells (one pass) on 101 of 108 rows" in line
    assert line.startswith("Priced / wall clock (decoding only) within 0.90-1.10: ")
    assert line.endswith("faster now): zoo-l verify 0.80, mid 0.91.")
    assert pricing_line({}) == ""  # a run before the check: no line


def test_half_split_line_states_the_mean_and_worst_report_and_is_empty_without_them():
    line = half_split_line({"mean_half_split": 0.9768, "min_half_split": 0.9162}, 6)
    assert "own 6 prompts" in line and "reaches 97.7% of the best" in line and "worst report 91.6%" in line
    assert half_split_line({"mean_best_kept": 0.8}, 6) == ""
