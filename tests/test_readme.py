"""`make results`: docs/results.md names its run, commit and dvc.lock; only the README's marked section
changes. Which run and commit may be named is tests/test_results_provenance.py's business."""

from __future__ import annotations

import hashlib

import pytest
from markdown_rows import md_rows, md_tables
from results_artifacts import GRAFT, WALL, deployed, graft_cell, write_artifacts

from collectors.evaluation.ledger import LedgerRow
from collectors.evaluation.results_text import (
    gains_line,
    graft_checks_line,
    half_split_line,
    headline_table,
    learned_budget_line,
    pricing_line,
    student_table,
)
from pipeline.readme import (
    END,
    LEDGER,
    RESULTS_PAGE,
    START,
    Provenance,
    lock_digest,
    named_provenance,
    results_page,
    update,
    write_results,
)

PROV = Provenance(commit="0123456789" * 4, lock_sha256="ab" * 32, run_id="f" * 32, date="2026-12-08")
ROW = LedgerRow(PROV.date, PROV.commit, PROV.lock_sha256, PROV.run_id, "make results", {})


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


def test_student_table_puts_the_evaluate_students_cell_beside_graft_and_n_a_where_it_has_none():
    cells = [graft_cell("zoo-m", "alpaca", 1.25, 1.5, 1.75), graft_cell("zoo-m", "pydoc", 2.0, 2.5)]
    main = [
        {"pair_id": "zoo-m", "dataset_id": "alpaca", "method": "student", "priced_speedup": 1.75,
         "mean_accepted_length": 2.5},
        {"pair_id": "zoo-m", "dataset_id": "pydoc", "method": "all-small", "priced_speedup": 9.0,
         "mean_accepted_length": 9.0},
    ]  # fmt: skip
    [table] = md_tables(student_table(cells, main))
    assert table[1] == [
        "zoo-m",
        "alpaca",
        "1.75x (A 2.50)",
        "1.25x (A 1.50)",
        "1.75x (A 1.50)",
        "1.50x (A 1.50)",
    ]
    assert table[2][:4] == [
        "zoo-m",
        "pydoc",
        "n/a",
        "2.00x (A 1.50)",
    ]  # another method's row is not the student's


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
    line = pricing_line(WALL)
    assert (
        "(the prices of every table above): within on 14 of 20, outside on 2, unresolved on 4 "
        "(median 1.02, 0.79-1.28)" in line
    )
    assert "profiled again just before its decodes (one pass): within on 17 of 20, outside on 0" in line
    assert line.startswith("Priced / measured (decoding only), its 95% interval against 0.90-1.10: ")
    assert line.endswith("faster now): zoo-l verify 0.80, mid 0.91.")
    assert pricing_line({}) == ""  # no wall_check metrics: no line


def test_half_split_line_states_the_mean_and_worst_report_and_is_empty_without_them():
    line = half_split_line({"mean_half_split": 0.9768, "min_half_split": 0.9162}, 6)
    assert "own 6 prompts" in line and "reaches 97.7% of the best" in line and "worst report 91.6%" in line
    assert half_split_line({"mean_best_kept": 0.8}, 6) == ""


def test_update_refuses_doubled_or_reversed_markers(tmp_path):
    readme = tmp_path / "README.md"
    for text in (f"{START}\n{END}\n{START}\n{END}\n", f"{END}\nx\n{START}\n"):
        readme.write_text(text)
        with pytest.raises(ValueError, match="exactly one pair of markers"):
            update(readme, f"{START}\nnew\n{END}")
        assert readme.read_text() == text


def test_results_page_is_headed_by_the_run_the_commit_and_the_lock_digest_then_the_ledger():
    page = results_page("## Main table\n\n| a |", PROV, [ROW])
    head = page.splitlines()[2]
    assert page.startswith("# Results\n\n")
    assert PROV.commit in head and PROV.lock_sha256 in head and PROV.run_id in head and PROV.date in head
    assert named_provenance(page) == (PROV.commit, PROV.lock_sha256)
    assert page.index("## Ledger") < page.index("## Main table")
    assert "taken from the log" not in page  # only where the ledger holds an imported row
    imported = results_page("x", Provenance(PROV.commit, PROV.lock_sha256, "", "2026-12-07"), [ROW])
    assert "the run of 2026-12-07 recorded in docs/LOG.md" in imported.splitlines()[2]


def test_lock_digest_is_the_sha256_of_dvc_lock(tmp_path):
    lock = tmp_path / "dvc.lock"
    with pytest.raises(FileNotFoundError, match=r"dvc\.lock"):
        lock_digest(tmp_path)
    lock.write_text("schema: '2.0'\n")
    assert lock_digest(tmp_path) == hashlib.sha256(lock.read_bytes()).hexdigest()


def test_headline_table_has_one_row_per_group_the_pricing_check_and_the_graft_row():
    metrics = {
        "deployed.priced_speedup.fitting": deployed(1.095, 1.0, 25, 0.84),
        "deployed.priced_speedup.held-out_pair": deployed(1.151, 1.022, 5, 1.0),
        "priced_speedup.fitting": deployed(2.0, 0.5, 25, 0.1),  # the student's own row is not the headline
    }
    [lines] = md_tables(headline_table(metrics, GRAFT, WALL))
    assert len(lines) == 5
    assert lines[1] == ["fitting (25)", "mean +9.5%, worst +0.0%", "84%", "n/a"]
    assert lines[2] == ["held-out pair (5)", "mean +15.1%, worst +2.2%", "100%", "n/a"]
    assert lines[3] == [
        "pricing vs the clock (`wall_check`, 20 pair x policy)",
        "priced / measured median 1.02 (0.79-1.28); 95% interval within 0.90-1.10 on 14 of 20",
        "",
        "",
    ]
    assert "full GRAFT 1.63x" in lines[4][1] and "1.72x wall clock" in lines[4][1] and "1.51x" in lines[4][1]
    assert lines[4][2] == "92% (vs DDTree's best B)"
    assert len(md_tables(headline_table(metrics, GRAFT))[0]) == 4  # no wall_check metrics: no such row
    with pytest.raises(ValueError, match="deployed"):
        headline_table({"priced_speedup.fitting": deployed(1.0, 1.0, 1)}, GRAFT)


def test_write_results_writes_every_file_or_none(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n{START}\nold\n{END}\n## Install\n")
    write_results(tmp_path, "## Main table", f"{START}\n| new |\n{END}", PROV, ROW)
    assert readme.read_text() == f"# T\n{START}\n| new |\n{END}\n## Install\n"
    page = (tmp_path / RESULTS_PAGE).read_text()
    assert PROV.commit in page and page.rstrip().endswith("## Main table")
    assert PROV.run_id in (tmp_path / LEDGER).read_text()
    # bad markers, then a ledger that does not read: each refuses before anything is written
    readme.write_text("# no markers\n")
    (tmp_path / RESULTS_PAGE).unlink()
    with pytest.raises(ValueError, match="markers"):
        write_results(tmp_path, "body", f"{START}\nx\n{END}", PROV, ROW)
    readme.write_text(f"{START}\n{END}\n")
    (tmp_path / LEDGER).write_text("date,commit\n")
    with pytest.raises(ValueError, match="columns"):
        write_results(tmp_path, "body", f"{START}\nx\n{END}", PROV, ROW)
    assert not (tmp_path / RESULTS_PAGE).exists() and readme.read_text() == f"{START}\n{END}\n"
    assert (tmp_path / LEDGER).read_text() == "date,commit\n"


def test_main_writes_the_results_page_and_the_headline_from_the_artifacts(tmp_path, monkeypatch):
    """The whole of `make results` on a fake checkout: every input read from the params' out_dirs."""
    import pipeline.readme as readme_mod
    from config.params import load_params

    params = load_params()
    monkeypatch.setattr(readme_mod, "resolve", lambda p: tmp_path / p)
    monkeypatch.setattr(readme_mod, "provenance_of", lambda params, root: PROV)

    write_artifacts(tmp_path, params)
    (tmp_path / "README.md").write_text(f"# T\n{START}\nold\n{END}\n## Install\n")

    assert readme_mod.main([]) == 0
    page = (tmp_path / RESULTS_PAGE).read_text()
    assert PROV.commit in page.splitlines()[2] and PROV.lock_sha256 in page.splitlines()[2]
    for table in ("| table.md |", "| wall.md |", "| budgets |", "| graft |", "| offline |", "| summary |"):
        assert table in page
    text = (tmp_path / "README.md").read_text()
    assert ["fitting (25)", "mean +9.5%, worst +0.0%", "84%", "n/a"] in md_rows(text)
    assert "within 0.90-1.10 on 14 of 20" in text
    assert "Priced / measured (decoding only)" in page
    assert f"[{RESULTS_PAGE}]({RESULTS_PAGE})" in text and "| table.md |" not in text
    assert text.startswith("# T\n") and text.endswith(f"{END}\n## Install\n")


def test_the_headline_carries_the_intervals_of_every_pass_and_the_adaptive_rule():
    """Where evaluate priced its headline under every profile pass (``headline``), the table shows
    each gain with its 95% interval and the deployed row's gain over the adaptive rule; the GRAFT
    row adds full GRAFT against DDTree's best B in hindsight."""
    metrics = {
        "deployed.priced_speedup.fitting": deployed(1.095, 1.0, 25, 0.84),
        "headline": {"fitting": {"mean": [1.09, 1.05, 1.13], "worst": [0.995, 0.97, 1.01],
                                 "vs_adaptive": [1.08, 1.02, 1.12], "n_cells": 25}},
    }  # fmt: skip
    [lines] = md_tables(headline_table(metrics, {**GRAFT, "graft_vs_hindsight": [1.08, 1.01, 1.15]}, WALL))
    assert lines[1] == ["fitting (25)", "mean +9.0% [+5.0%, +13.0%], worst -0.5% [-3.0%, +1.0%]", "84%",
                        "+8.0% [+2.0%, +12.0%]"]  # fmt: skip
    assert lines[-1][1].endswith("full GRAFT vs that best B +8.0% [+1.0%, +15.0%]")
