"""`make results`: docs/results.md names its commit and dvc.lock; only the README's marked section changes."""

from __future__ import annotations

import hashlib
import subprocess

import pytest
from markdown_rows import md_rows, md_tables

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
    RESULTS_PAGE,
    START,
    Provenance,
    provenance,
    results_page,
    update,
    write_results,
)

PROV = Provenance(commit="0123456789abcdef0123456789abcdef01234567", dirty=False, lock_sha256="ab" * 32)


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


WALL = {
    "summary": {
        "stage": {"rows": 20, "within": 14, "outside": 2, "unresolved": 4, "min": 0.79, "median": 1.02,
                  "max": 1.28},
        "beside": {"rows": 20, "within": 17, "outside": 0, "unresolved": 3, "min": 0.88, "median": 0.99,
                   "max": 1.12},
    },
    "profile_drift": {"zoo-l": {"verify": 0.8, "mid": 0.91}},
}  # fmt: skip


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


def test_results_page_is_headed_by_the_commit_and_the_lock_digest():
    page = results_page("## Main table\n\n| a |", PROV)
    head = page.splitlines()[2]
    assert page.startswith("# Results\n\n")
    assert PROV.commit in head and PROV.lock_sha256 in head and "uncommitted" not in head
    dirty = results_page("x", Provenance(PROV.commit, True, PROV.lock_sha256))
    assert "with uncommitted changes" in dirty.splitlines()[2]


def test_provenance_reads_head_and_hashes_dvc_lock(tmp_path):
    lock = tmp_path / "dvc.lock"
    with pytest.raises(FileNotFoundError, match=r"dvc\.lock"):
        provenance(tmp_path)
    lock.write_text("schema: '2.0'\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("add", "dvc.lock")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lock")
    prov = provenance(tmp_path)
    assert prov.commit == git("rev-parse", "HEAD").strip()
    assert prov.lock_sha256 == hashlib.sha256(lock.read_bytes()).hexdigest() and not prov.dirty
    lock.write_text("schema: '3.0'\n")  # an edit to a tracked file marks the checkout dirty
    assert provenance(tmp_path).dirty


def deployed(mean: float, worst: float, n: int, best: float | None = None) -> dict:
    stats = {"student_gain_mean": mean, "student_gain_best": 1.5, "student_gain_worst": worst, "n_cells": n}
    return stats if best is None else {**stats, "student_at_least_best_fixed": best}


GRAFT = {"n_cells": 12, "mean_speedup": {"full": 1.63, "hindsight": 1.51},
         "mean_wall_speedup": {"full": 1.72}, "full_graft_at_least_hindsight": 11 / 12}  # fmt: skip


def test_headline_table_has_one_row_per_group_the_pricing_check_and_the_graft_row():
    metrics = {
        "deployed.priced_speedup.fitting": deployed(1.095, 1.0, 25, 0.84),
        "deployed.priced_speedup.held-out_pair": deployed(1.151, 1.022, 5, 1.0),
        "priced_speedup.fitting": deployed(2.0, 0.5, 25, 0.1),  # the student's own row is not the headline
    }
    [lines] = md_tables(headline_table(metrics, GRAFT, WALL))
    assert len(lines) == 5
    assert lines[1] == ["fitting (25)", "mean +9.5%, worst +0.0%", "84%"]
    assert lines[2] == ["held-out pair (5)", "mean +15.1%, worst +2.2%", "100%"]
    assert lines[3] == [
        "pricing vs the clock (`wall_check`, 20 pair x policy)",
        "priced / measured median 1.02 (0.79-1.28); 95% interval within 0.90-1.10 on 14 of 20",
        "",
    ]
    assert "full GRAFT 1.63x" in lines[4][1] and "1.72x wall clock" in lines[4][1] and "1.51x" in lines[4][1]
    assert lines[4][2] == "92% (vs DDTree's best B)"
    assert len(md_tables(headline_table(metrics, GRAFT))[0]) == 4  # no wall_check metrics: no such row
    with pytest.raises(ValueError, match="deployed"):
        headline_table({"priced_speedup.fitting": deployed(1.0, 1.0, 1)}, GRAFT)


def test_write_results_writes_both_files_or_neither(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n{START}\nold\n{END}\n## Install\n")
    write_results(tmp_path, "## Main table", f"{START}\n| new |\n{END}", PROV)
    assert readme.read_text() == f"# T\n{START}\n| new |\n{END}\n## Install\n"
    page = (tmp_path / RESULTS_PAGE).read_text()
    assert PROV.commit in page and page.rstrip().endswith("## Main table")
    readme.write_text("# no markers\n")
    (tmp_path / RESULTS_PAGE).unlink()
    with pytest.raises(ValueError, match="markers"):
        write_results(tmp_path, "body", f"{START}\nx\n{END}", PROV)
    assert not (tmp_path / RESULTS_PAGE).exists() and readme.read_text() == "# no markers\n"


def test_main_writes_the_results_page_and_the_headline_from_the_artifacts(tmp_path, monkeypatch):
    """The whole of `make results` on a fake checkout: every input read from the params' out_dirs."""
    import json

    import pipeline.readme as readme_mod
    from config.params import load_params

    params = load_params()
    monkeypatch.setattr(readme_mod, "resolve", lambda p: tmp_path / p)
    monkeypatch.setattr(readme_mod, "provenance", lambda root: PROV)

    def put(out_dir: str, name: str, content: object) -> None:
        path = tmp_path / out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))

    ev = {"deployed.priced_speedup.fitting": deployed(1.095, 1.0, 25, 0.84)}
    for name in ("table.md", "ablations.md"):
        put(params.evaluate.out_dir, name, f"| {name} |")
    put(params.evaluate.out_dir, "metrics.json", ev)
    put(params.wall_check.out_dir, "wall.md", "| wall.md |")
    put(params.wall_check.out_dir, "metrics.json", WALL)
    put(params.evaluate.out_dir, "results.json", {"main": []})
    put(params.budget.out_dir, "budgets.md", "| budgets |")
    put(params.distill.out_dir, "offline.md", "| offline |")
    put(params.collect.out_dir, "summary.md", "| summary |")
    put(params.collect.out_dir, "metrics.json", {})
    budgets = {"plain": {"budget": 9}, "tdes": {"budget": 10}}
    graft = {**GRAFT, "pairs": {"zoo-m": {"learned_budget": budgets}},
             "graft_at_least_hindsight": 0.0, "graft_rule_at_least_hindsight": 0.5,
             "learned_at_least_saba_on_mean": True, "full_graft_at_least_saba_graft_on_mean": True,
             "tdes_raises_a": 0.9, "tdes_keeps_or_raises_a": 0.9, "tdes_raises_a_at_learned_budget": 0.9,
             "max_overhead_ms": 0.17}  # fmt: skip
    put(params.graft_eval.out_dir, "metrics.json", graft)
    put(params.graft_eval.out_dir, "cells.json", [graft_cell("zoo-m", "alpaca", 1.2, 1.1)])
    put(params.graft_eval.out_dir, "graft.md", "| graft |")
    (tmp_path / "README.md").write_text(f"# T\n{START}\nold\n{END}\n## Install\n")

    assert readme_mod.main([]) == 0
    page = (tmp_path / RESULTS_PAGE).read_text()
    assert PROV.commit in page.splitlines()[2] and PROV.lock_sha256 in page.splitlines()[2]
    for table in ("| table.md |", "| wall.md |", "| budgets |", "| graft |", "| offline |", "| summary |"):
        assert table in page
    text = (tmp_path / "README.md").read_text()
    assert ["fitting (25)", "mean +9.5%, worst +0.0%", "84%"] in md_rows(text)
    assert "within 0.90-1.10 on 14 of 20" in text
    assert "Priced / measured (decoding only)" in page
    assert f"[{RESULTS_PAGE}]({RESULTS_PAGE})" in text and "| table.md |" not in text
    assert text.startswith("# T\n") and text.endswith(f"{END}\n## Install\n")
