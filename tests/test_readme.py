"""`make results`: only the marked section of the README is rewritten."""

from __future__ import annotations

import pytest

from pipeline.readme import END, START, gains_line, update


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
