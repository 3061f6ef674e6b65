"""benchmarks/bench_deployed.py's table: one row per dataset with evaluate's priced figure, and a
pooled row that has no priced figure of its own."""

from __future__ import annotations

import sys
from pathlib import Path

from markdown_rows import md_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_deployed

NAMES = ["all-small", "all-mid", "budget", "best-fixed", "adaptive", "deployed",
         "deployed vs better endpoint", "deployed vs budget", "deployed vs adaptive"]  # fmt: skip


def _row(dataset: str, lossless: dict | None) -> dict:
    row = {"dataset": dataset, "prompts": 3, "runs": 2,
           "speedups": {n: [1.5 + i / 100, 1.2, 1.8] for i, n in enumerate(NAMES)}}  # fmt: skip
    if lossless is not None:
        row["lossless"] = {"deployed": lossless}
    return row


def test_the_table_prices_each_dataset_and_leaves_the_pooled_row_unpriced():
    counts = {"identical": 2, "near_ties": 1, "real_mismatches": 0}
    rows = [_row("gsm8k", counts), _row("pooled", counts)]
    (table,) = md_tables(bench_deployed.table(rows, {"gsm8k": 1.734}))
    head, *body = table
    by_dataset = {r[0]: dict(zip(head, r, strict=True)) for r in body}
    assert by_dataset["gsm8k"]["deployed priced"] == "1.73x"
    assert by_dataset["pooled"]["deployed priced"] == "-"
    assert by_dataset["gsm8k"]["deployed"] == "1.55x [1.20, 1.80]"
    assert by_dataset["gsm8k"]["vs budget"] == "1.57x [1.20, 1.80]"
    assert by_dataset["pooled"]["outputs vs AR (deployed)"] == "2 identical, 1 near-ties, 0 real"
