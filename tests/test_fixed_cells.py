"""evaluate_fixed + evaluate equal the one-pass priced replay: the fixed schedules priced upstream
(collectors/evaluation/fixed_cells.py), stored as JSON and Parquet float for float, and merged with the
policies replayed from the stored continuations and target rows give every cell field by field;
the policy pass decodes no continuation and runs no target forward; a part priced on other
prompts, a missing cell, another schema or a rows file other than the one written is one error naming the
file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_pool import CELLS, POLICIES, _same, eval_params, pool_workspace

from collectors.collect.replay import Replayer
from collectors.evaluation import priced_tasks
from collectors.evaluation.eval_report import priced_rows
from collectors.evaluation.fixed_cells import FIXED_METHODS, read_fixed, write_fixed
from collectors.evaluation.priced_eval import merge_parts
from collectors.evaluation.priced_tasks import priced_cells


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return pool_workspace(tmp_path_factory.mktemp("fixed"))


def test_stored_fixed_parts_merged_with_the_policies_equal_the_one_pass_replay(
    workspace,
    tmp_path,
    monkeypatch,
) -> None:
    params = eval_params(workspace, 1)
    one_pass = priced_cells(params, CELLS, POLICIES, FIXED_METHODS)
    fixed = priced_cells(params, CELLS, {}, FIXED_METHODS)
    ablations = [{"method": "full", "speedup": 1.2345678901234567}]
    path = write_fixed(tmp_path / "fixed" / "fixed.json", fixed, ablations)
    stored, rows = read_fixed(path, CELLS)
    assert rows == ablations
    assert path.with_name("fixed.rows.parquet").is_file()
    assert fixed[CELLS[0]].pass_ar_ms.shape[0] == params.profile.passes  # priced under every pass
    for cell in CELLS:  # JSON and Parquet round trip: every double, continuation and row as written
        _same(stored[cell], fixed[cell])
        assert (stored[cell].continuations, stored[cell].prompts_sha256, stored[cell].rows) == (
            fixed[cell].continuations, fixed[cell].prompts_sha256, fixed[cell].rows,
        )  # fmt: skip
        g, _ = fixed[cell].continuations[0]
        tokens, logps = fixed[cell].rows[0]
        assert len(tokens) == len(logps) > len(g)  # a row per position of prompt + g but the last
        assert all(len(t) == params.tree.topk and lp == tuple(sorted(lp, reverse=True))
                   for t, lp in zip(tokens, logps, strict=True))  # fmt: skip
    decoded: list[tuple] = []
    real = Replayer.continuation
    monkeypatch.setattr(Replayer, "continuation", lambda self, p: decoded.append(p) or real(self, p))
    forwards: list[tuple] = []
    rows_of = Replayer.rows_and_check
    monkeypatch.setattr(
        Replayer, "rows_and_check", lambda self, p, t: forwards.append(p) or rows_of(self, p, t)
    )
    merged = priced_cells(params, CELLS, POLICIES, {}, hindsight=False, fixed_parts=stored)
    assert decoded == [] and forwards == []  # every g and every target row came from the stored part
    for cell in CELLS:
        _same(merged[cell], one_pass[cell])
        assert merged[cell].continuations == one_pass[cell].continuations
        assert priced_rows(merged[cell], 200) == priced_rows(one_pass[cell], 200)
    assert list(merged[CELLS[0]].methods) == list(one_pass[CELLS[0]].methods)  # row order too


def test_a_part_from_other_prompts_or_a_clashing_method_is_refused(workspace, tmp_path) -> None:
    params = eval_params(workspace, 1)
    cells = CELLS[:1]
    fixed = priced_cells(params, cells, {}, FIXED_METHODS)
    stale = {cells[0]: replace(fixed[cells[0]], prompts_sha256="0" * 64)}
    with pytest.raises(ValueError, match=r"tiny/code: the stored fixed part was priced on other prompts"):
        priced_tasks.priced_group(params, cells, POLICIES, {}, None, False, stale)
    with pytest.raises(
        ValueError, match=r"methods \['10101', 'all-mid', 'all-small', 'best-fixed'\] are in both parts"
    ):
        merge_parts(fixed[cells[0]], fixed[cells[0]])
    with pytest.raises(ValueError, match="different prompts"):
        merge_parts(fixed[cells[0]], replace(fixed[cells[0]], continuations=()))


def test_a_missing_cell_or_another_schema_is_one_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fixed.json"
    with pytest.raises(FileNotFoundError, match="run the evaluate_fixed stage first"):
        read_fixed(path, CELLS)
    write_fixed(path, {}, [])
    with pytest.raises(ValueError, match=r"fixed\.json: no fixed part for cell\(s\) \['tiny/code'"):
        read_fixed(path, CELLS)
    path.write_text(json.dumps({"schema_version": "other/9", "cells": [], "ablations": []}))
    with pytest.raises(
        ValueError, match=r"fixed\.json: not an evaluate_fixed file \(schema_version 'other/9'"
    ):
        read_fixed(path, CELLS)


def test_a_rows_file_missing_or_from_another_write_is_refused(workspace, tmp_path: Path) -> None:
    params = eval_params(workspace, 1)
    fixed = priced_cells(params, CELLS[:1], {}, FIXED_METHODS)
    path = write_fixed(tmp_path / "a" / "fixed.json", fixed, [])
    rows = path.with_name("fixed.rows.parquet")
    other = write_fixed(
        tmp_path / "b" / "fixed.json", {c: replace(p, rows=p.rows[:1]) for c, p in fixed.items()}, []
    )
    assert (
        len(fixed[CELLS[0]].rows) > 1
        and read_fixed(other, CELLS[:1])[0][CELLS[0]].rows == fixed[CELLS[0]].rows[:1]
    )
    rows.write_bytes(other.with_name("fixed.rows.parquet").read_bytes())  # a valid rows file, not this one's
    with pytest.raises(ValueError, match=r"fixed\.rows\.parquet is not the rows file written with it"):
        read_fixed(path, CELLS[:1])
    rows.unlink()
    with pytest.raises(
        FileNotFoundError, match=r"fixed\.rows\.parquet: missing; rerun the evaluate_fixed stage"
    ):
        read_fixed(path, CELLS[:1])
