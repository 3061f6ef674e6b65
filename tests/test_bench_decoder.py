"""`make bench`'s host-work part runs the real speculative loop with a stand-in verifier: it must keep
up with the loop's contract (the prefill hands over a row source read a block at a time), and its
windowed variant must draft the very same trees at every context, or its 32k / 1k ratios compare
different work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_decoder.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_decoder", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_text_rows_serve_aligned_blocks_like_the_prefill(bench):
    tokens = [[i, i + 1] for i in range(40)]
    logps = [[-0.5, -1.0 - i] for i in range(40)]
    rows = bench.TextRows(tokens, logps)
    assert (rows.start, rows.count) == (0, 40)
    block = rows.block(37)  # the last, partial block of 16-aligned positions 32..39
    assert block.start == 32
    assert block.tokens == tokens[32:40] and block.logps == logps[32:40]
    assert rows.block(16).tokens == tokens[16:32]


def test_windowed_contexts_draft_the_same_trees(bench):
    rounds = bench.bench_context_rounds(contexts=(128, 512), window=128, new_tokens=24, reps=1)
    short, long = rounds[128], rounds[512]
    assert short["nodes"] > 0  # the n-gram drafter drafted from the prompt's rows
    assert (short["nodes"], short["A"]) == (long["nodes"], long["A"])
    assert short["over"] > 0 and long["over"] > 0
