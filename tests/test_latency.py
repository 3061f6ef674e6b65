"""Latency accounting: profile measurement, cost-curve interpolation, JSON I/O, pricing of round counts.

Timings are never asserted against each other (noisy machines); only their sanity and the arithmetic.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sysconfig
from pathlib import Path

import pytest
from conftest import noisy_copy, tiny_model, train_tokenizer
from hypothesis import given
from hypothesis import strategies as st

from collectors.collect.records import RoundRecord
from collectors.collect.trajectory import small_frontier
from collectors.pricing.profile_passes import compare_profiles, median_profile, save_profile
from collectors.pricing.profile_rounds import (
    Reference,
    grown,
    prefix_tree,
    random_tree,
    reference_context,
    student_like,
)
from collectors.pricing.profiling import (
    AR_BURST,
    AR_WARM,
    Job,
    ar_burst,
    fit_small_step,
    measure_profile,
    robust_medians,
)
from config.params import ProfileParams
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.deploy.latency import (
    SCHEMA_VERSION,
    LatencyProfile,
    RoundCounts,
    counts_from_round,
    fed_before_calls,
    interpolate,
    interpolate_grid,
    load_profile,
    price_ar,
    price_round,
    round_parts,
)
from decoder.generate import generate
from decoder.io import files
from decoder.models.pair import make_pair
from pipeline.profile import PASSES_FILE, format_table, run_profile

SIZES = (1, 4, 16)
MID_TOKENS, MID_FED = (1, 8), (0, 4)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3", seed=21)
    return make_pair(target, noisy_copy(target, 0.3, seed=22), eos_token_ids=())


@pytest.fixture(scope="module")
def measured(pair) -> LatencyProfile:
    return measure_profile(
        pair, "tiny", context_len=32, sizes=SIZES, warmup=1, repeats=3, mid_tokens=MID_TOKENS, mid_fed=MID_FED
    )


MID_COLS, MID_ROWS = (1, 8, 32), (0, 16, 64)


def linear_profile(scale: float = 1.0, **kw) -> LatencyProfile:
    """Hand-made, all times x `scale`: verify 2 + 0.5 n, mid 1 + 0.25 n + 0.01 fed, small step
    0.1 + 0.02 per frontier node (mean frontier 5), decision 0.01, AR 3, tree 0.3 + 0.002 n, a block
    of prompt rows 0.4."""
    fields = dict(
        pair="hand",
        device="cpu",
        device_name="test",
        torch_threads=1,
        clock="wall",
        torch_version="0",
        dtype="float32",
        context_len=256,
        warmup=3,
        repeats=15,
        samples_per_repeat=3,
        verify_points=tuple((n, scale * (2 + 0.5 * n)) for n in (1, 2, 4, 8, 64)),
        mid_tokens=MID_COLS,
        mid_fed=MID_ROWS,
        mid_grid_ms=tuple(tuple(scale * (1 + 0.25 * n + 0.01 * f) for n in MID_COLS) for f in MID_ROWS),
        mid_end_ms=scale * 0.05,
        ngram_step_ms=scale * 0.1,
        ngram_node_ms=scale * 0.02,
        ngram_mean_frontier=5.0,
        decision_ms=scale * 0.01,
        ar_token_ms=scale * 3.0,
        tree_points=tuple((n, scale * (0.3 + 0.002 * n)) for n in (1, 64, 512)),
        prompt_block_ms=scale * 0.4,
    )
    return LatencyProfile(**{**fields, **kw})


def test_measured_profile_is_sane(measured: LatencyProfile) -> None:
    assert [n for n, _ in measured.verify_points] == list(SIZES)  # all within the budget + 1
    assert [n for n, _ in measured.tree_points] == list(SIZES)
    assert (measured.mid_tokens, measured.mid_fed) == (MID_TOKENS, MID_FED)
    assert [len(row) for row in measured.mid_grid_ms] == [len(MID_TOKENS)] * len(MID_FED)
    values = [ms for _, ms in measured.verify_points + measured.tree_points]
    values += [ms for row in measured.mid_grid_ms for ms in row]
    scalars = [measured.decision_ms, measured.ar_token_ms, measured.small_ms(1), measured.mid_end_ms]
    scalars.append(measured.prompt_block_ms)
    colds = [measured.mid_cold_ms, measured.decision_cold_ms, *(ms for _, ms in measured.verify_cold_points)]
    assert [n for n, _ in measured.verify_cold_points] == [1, 8]  # the grid's smallest, middle, largest
    assert all(math.isfinite(v) and v >= 0 for v in colds)  # extras over warm figures, floored at 0
    assert all(math.isfinite(v) and v > 0 for v in values + scalars)
    assert measured.ngram_step_ms >= 0 and measured.ngram_node_ms >= 0
    assert 1 <= measured.ngram_mean_frontier <= 10  # W = 10 frontier nodes at most
    assert (measured.device, measured.dtype, measured.context_len) == ("cpu", "float32", 32)
    assert measured.device_name and measured.torch_threads == 1 and measured.samples_per_repeat == 3
    assert measured.clock == "thread_cpu"  # one torch thread on a CPU: contention-free CPU time
    for n, ms in measured.verify_points:
        assert measured.verify_ms(n) == ms
    for f, row in zip(MID_FED, measured.mid_grid_ms, strict=True):
        for n, ms in zip(MID_TOKENS, row, strict=True):
            assert measured.mid_ms(n, f) == pytest.approx(ms)


def test_pair_without_mid_has_no_mid_costs(pair) -> None:
    solo = make_pair(pair.target, None, eos_token_ids=())
    prof = measure_profile(solo, "solo", context_len=16, sizes=(1, 2), warmup=0, repeats=1)
    assert (prof.mid_tokens, prof.mid_fed, prof.mid_grid_ms, prof.has_mid, prof.mid_end_ms) == (
        (),
        (),
        (),
        False,
        0,
    )
    assert prof.mid_cold_ms == 0.0 and prof.verify_cold_points == ()  # their jobs need a mid call
    with pytest.raises(ValueError, match="no mid-drafter timings"):
        prof.mid_ms(3)
    assert price_round(prof, RoundCounts(3, (), 5, 5)) > 0


def test_measure_rejects_contexts_past_the_model(pair) -> None:
    with pytest.raises(ValueError, match="exceed"):
        measure_profile(pair, "x", context_len=pair.context_len, sizes=SIZES)


def test_reference_context_and_random_trees(pair) -> None:
    import numpy as np

    ctx = reference_context(pair, 100)
    assert len(ctx) == 100 and all(0 <= t < pair.vocab_size for t in ctx)
    assert len(set(itertools.pairwise(ctx))) < 99  # repeated bigrams: n-gram matches exist
    for n in (1, 2, 17):
        tree = random_tree(n, 5, pair.vocab_size, np.random.default_rng(n))
        assert len(tree) == n and tree.tokens[0] == 5
        assert all(tree.parents[v] < v for v in range(1, n))
    base = random_tree(30, 5, pair.vocab_size, np.random.default_rng(0))
    big = grown(base, 200, pair.vocab_size, np.random.default_rng(1), max_depth=4)
    assert len(big) == 200 and big.tokens[:30] == base.tokens and big.parents[:30] == base.parents
    assert max(big.depths[30:]) <= 4
    for n in (1, 7, 200):
        head = prefix_tree(big, n)  # the first n nodes, same indices, same path scores
        assert (head.tokens, head.parents, head.scores) == (big.tokens[:n], big.parents[:n], big.scores[:n])
    with pytest.raises(ValueError):
        prefix_tree(big, 201)
    tok = train_tokenizer(["def f(x):\n    return x + 1\n", "import os, sys\nclass A: pass\n"] * 20, 80)
    with_tok = dataclasses.replace(pair, tokenizer=tok, vocab_size=len(tok))
    ids = reference_context(with_tok, 300)  # tokenized stdlib source
    assert len(ids) == 300 and all(0 <= t < len(tok) for t in ids)
    first = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[0].read_text(errors="ignore")
    assert ids == tok(first)["input_ids"][:300]


def test_interpolation_exact_between_and_beyond() -> None:
    prof = linear_profile()
    for n in (1, 2, 3, 4, 5, 8, 33, 64):
        assert prof.verify_ms(n) == pytest.approx(2 + 0.5 * n)
    assert prof.verify_ms(100) == pytest.approx(2 + 0.5 * 100)  # extends the last segment
    assert prof.mid_ms(100) == pytest.approx(1 + 0.25 * 100)
    assert prof.mid_ms(0) == 0.0 and prof.mid_ms(0, 30) == 0.0  # no forward happens
    assert prof.tree_ms(300) == pytest.approx(0.3 + 0.002 * 300)
    points = ((2, 5.0), (4, 9.0), (8, 7.0))
    assert interpolate(points, 1) == 5.0  # below the first size: its cost
    assert interpolate(points, 6) == pytest.approx(8.0)
    assert interpolate(points, 100) == 7.0  # a falling last segment is not extended downwards
    assert interpolate(((3, 4.0),), 50) == 4.0
    with pytest.raises(ValueError):
        prof.verify_ms(0)
    with pytest.raises(ValueError):
        prof.tree_ms(0)


def test_mid_table_is_bilinear_and_clamped() -> None:
    prof = linear_profile()
    for n, f in itertools.product((1, 3, 8, 20, 32, 70), (0, 5, 16, 40, 64, 200)):
        assert prof.mid_ms(n, f) == pytest.approx(1 + 0.25 * n + 0.01 * f), (n, f)  # exact on a plane
    rows, cols = (0, 10), (1, 5)
    grid = ((1.0, 3.0), (2.0, 8.0))
    assert interpolate_grid(rows, cols, grid, 5, 3) == pytest.approx((2.0 + 5.0) / 2)  # centre: mean
    assert interpolate_grid(rows, cols, grid, 0, 0) == 1.0  # below both axes: the corner
    falling = ((1.0, 3.0), (0.5, 2.0))  # more fed nodes measured cheaper: noise
    assert interpolate_grid(rows, cols, falling, 50, 5) == 2.0  # not extrapolated downwards
    assert interpolate_grid(rows, cols, falling, 50, 9) == pytest.approx(
        2.0 + (2.0 - 0.5) / 4 * 4
    )  # last row's rise


@given(
    st.lists(st.floats(0, 10), min_size=2, max_size=4),
    st.lists(st.floats(0, 10), min_size=2, max_size=4),
    st.tuples(st.integers(0, 400), st.integers(0, 400)),
    st.tuples(st.integers(0, 400), st.integers(0, 400)),
)
def test_monotone_tables_give_monotone_mid_costs(
    row_steps: list[float], col_steps: list[float], a: tuple[int, int], b: tuple[int, int]
) -> None:
    rows, cols = (0, 16, 64, 256)[: len(row_steps)], (1, 8, 32, 128)[: len(col_steps)]
    grid = tuple(
        tuple(sum(row_steps[: i + 1]) + sum(col_steps[: j + 1]) for j in range(len(cols)))
        for i in range(len(rows))
    )
    lo, hi = (min(a[0], b[0]), min(a[1], b[1])), (max(a[0], b[0]), max(a[1], b[1]))
    assert interpolate_grid(rows, cols, grid, *lo) <= interpolate_grid(rows, cols, grid, *hi) + 1e-9


@given(
    st.lists(st.floats(0, 100), min_size=1, max_size=8),
    st.lists(st.integers(1, 300), min_size=2, max_size=8),
)
def test_nondecreasing_points_give_nondecreasing_costs(increments: list[float], queries: list[int]) -> None:
    sizes = [1, 2, 3, 5, 8, 13, 21, 34][: len(increments)]
    values = [sum(increments[: i + 1]) for i in range(len(increments))]
    points = tuple(zip(sizes, values, strict=True))
    costs = [interpolate(points, n) for n in sorted(queries)]
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(costs))
    assert costs[0] >= values[0] - 1e-9


def test_bad_points_are_rejected() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        linear_profile(verify_points=((2, 1.0), (1, 2.0)))
    with pytest.raises(ValueError, match="finite"):
        linear_profile(tree_points=((1, float("nan")),))
    with pytest.raises(ValueError, match="finite"):
        linear_profile(mid_grid_ms=((1.0, float("nan"), 2.0),) * 3)
    with pytest.raises(ValueError, match="must not be empty"):
        linear_profile(verify_points=())
    with pytest.raises(ValueError, match="ngram_step_ms"):
        linear_profile(ngram_step_ms=-1.0)
    with pytest.raises(ValueError, match="mid_grid_ms must be 3 rows"):
        linear_profile(mid_grid_ms=((1.0, 2.0, 3.0),))
    with pytest.raises(ValueError, match="mid_fed"):
        linear_profile(mid_fed=(-1, 16, 64))
    with pytest.raises(ValueError, match="tree_points"):
        linear_profile(tree_points=())


def test_price_round_arithmetic() -> None:
    prof = linear_profile()
    counts = RoundCounts(
        verified_nodes=10,
        mid_call_tokens=(40, 8, 0),
        small_steps=2,
        decisions=5,
        tree_nodes=100,
        small_frontier=7,
    )
    assert counts.mid_call_fed == (0, 40, 48)  # default: earlier calls' tokens
    mid = (1 + 0.25 * 40) + (1 + 0.25 * 8 + 0.01 * 40) + 0.0 + 0.05  # + the end-of-round KV keep
    expected = (2 + 0.5 * 10) + mid + (2 * 0.1 + 7 * 0.02) + 5 * 0.01 + (0.3 + 0.002 * 100)
    assert price_round(prof, counts) == pytest.approx(expected)
    bare = RoundCounts(10, (40, 8), 2, 5)  # no tree size / frontier: verified nodes, mean frontier
    assert bare.tree_nodes == 10
    expected = (2 + 0.5 * 10) + mid + (2 * 0.1 + 2 * 5 * 0.02) + 5 * 0.01 + (0.3 + 0.002 * 10)
    assert price_round(prof, bare) == pytest.approx(expected)
    assert price_ar(prof, 7) == pytest.approx(21.0)
    # blocks of prompt rows computed in the round: 0.4 ms each, in the n-gram part
    read = dataclasses.replace(bare, prompt_blocks=3)
    assert round_parts(prof, read)["ngram"] == pytest.approx(round_parts(prof, bare)["ngram"] + 1.2)
    assert price_round(prof, read) == pytest.approx(expected + 1.2)
    with pytest.raises(ValueError):
        RoundCounts(10, (), 5, 5, prompt_blocks=-1)
    with pytest.raises(ValueError):
        RoundCounts(verified_nodes=0, mid_call_tokens=(), small_steps=0, decisions=0)
    with pytest.raises(ValueError):
        RoundCounts(verified_nodes=1, mid_call_tokens=(-1,), small_steps=0, decisions=0)
    with pytest.raises(ValueError, match="one fed count per mid call"):
        RoundCounts(1, (3, 4), 0, 0, mid_call_fed=(0,))
    with pytest.raises(ValueError):
        RoundCounts(10, (), 5, 5, tree_nodes=9)  # the tree holds at least what was verified


def test_a_round_that_verifies_the_root_alone_is_priced_as_an_ar_step() -> None:
    """The decoder runs a round left with no drafted node as one autoregressive step (DRAFTLESS), so
    its verify part is the AR step (3 ms here), not a one-node tree verify (2.5 ms); its drafting
    and tree work are priced as any round's. A round that verifies a drafted node is unchanged."""
    prof = linear_profile(ar_token_ms=3.0)
    draftless = RoundCounts(1, (), 5, 0, tree_nodes=1, small_frontier=0)
    parts = round_parts(prof, draftless)
    assert prof.round_verify_ms(1) == 3.0 and prof.verify_ms(1) == pytest.approx(2.5)
    assert parts["verify"] == pytest.approx(3.0)
    assert parts["ngram"] == pytest.approx(5 * 0.1) and parts["tree"] == pytest.approx(0.3 + 0.002)
    assert prof.round_verify_ms(2) == prof.verify_ms(2) == pytest.approx(3.0)
    assert round_parts(prof, RoundCounts(2, (), 5, 0))["verify"] == pytest.approx(3.0)
    assert round_parts(linear_profile(ar_token_ms=0.7), draftless)["verify"] == pytest.approx(0.7)


def test_cold_terms_are_charged_once_per_round_that_pays_them() -> None:
    """A round pays each cold-cache term once, whatever the number of calls or decisions, and only
    when it runs the work that follows the other model: a mid forward (mid and verify terms), a
    decision (decision term); the verify's term is read at the tokens of the round's last mid
    forward. A mid call of 0 tokens runs no forward and pays no cold term."""
    warm = linear_profile()
    verify_cold = ((1, 0.2), (16, 0.5), (128, 0.9))
    cold = linear_profile(verify_cold_points=verify_cold, mid_cold_ms=0.5, decision_cold_ms=0.3)
    for tokens, after in (
        ((), 0.0),
        ((0,), 0.0),
        ((4,), 0.2 + 0.3 * 3 / 15),
        ((4, 16, 0), 0.5),
        ((2, 100), 0.8),
    ):
        for decisions in (0, 1, 5):
            counts = RoundCounts(10, tokens, 5 - len(tokens), decisions)
            extra = price_round(cold, counts) - price_round(warm, counts)
            want = after + (0.5 if any(tokens) else 0.0) + (0.3 if decisions else 0.0)
            assert extra == pytest.approx(want), (tokens, decisions)
            parts, warm_parts = round_parts(cold, counts), round_parts(warm, counts)
            assert parts["verify"] - warm_parts["verify"] == pytest.approx(after)
            assert parts["scheduler"] - warm_parts["scheduler"] == pytest.approx(0.3 if decisions else 0.0)
    with pytest.raises(ValueError, match="mid_cold_ms"):
        linear_profile(mid_cold_ms=-1.0)
    with pytest.raises(ValueError, match="verify_cold_points"):
        linear_profile(verify_cold_points=((16, 0.5), (1, 0.2)))


def test_fed_counts_leave_catch_up_out() -> None:
    assert fed_before_calls([]) == () and fed_before_calls([7]) == (0,)
    assert fed_before_calls([1, 10, 100]) == (0, 1, 11)
    rec = RoundRecord(
        accepted=2,
        emitted=3,
        verified_nodes=20,
        mid_tree_tokens=(1, 10, 100),
        mid_catch_up=50,
        small_steps=2,
        signals=((0.0,),) * 5,
        tree_nodes=150,
        small_frontier=12,
    )
    counts = rec.counts()
    assert counts.mid_call_tokens == (51, 10, 100)  # catch-up rides on the first call...
    assert counts.mid_call_fed == (0, 1, 11)  # ...but is committed context, not fed tree nodes
    assert (counts.tree_nodes, counts.small_frontier, counts.decisions) == (150, 12, 5)
    unknown = dataclasses.replace(rec, tree_nodes=0, small_frontier=None).counts()
    assert (unknown.tree_nodes, unknown.small_frontier) == (20, None)


def test_repricing_same_counts_scales_with_the_profile() -> None:
    counts = [
        RoundCounts(64, (70, 12), 3, 5, tree_nodes=300, small_frontier=20),
        RoundCounts(1, (), 5, 5),
        RoundCounts(20, (5,) * 5, 0, 5, mid_call_fed=(0, 5, 10, 15, 20)),
    ]
    cpu, gpu = linear_profile(scale=1.0), linear_profile(scale=0.125)
    total_cpu = sum(price_round(cpu, c) for c in counts)
    total_gpu = sum(price_round(gpu, c) for c in counts)
    assert total_cpu != total_gpu
    assert total_gpu / total_cpu == pytest.approx(0.125)
    assert price_ar(gpu, 50) / price_ar(cpu, 50) == pytest.approx(0.125)


def test_counts_from_real_rounds(pair, measured: LatencyProfile) -> None:
    prompt = reference_context(pair, 40)
    res = generate(pair, prompt, "10101", DecodeConfig(max_new_tokens=12))
    assert res.rounds
    for rd in res.rounds:
        counts = counts_from_round(rd)
        mids = [s for s in rd.steps if s.used_mid]
        assert counts.verified_nodes == rd.verified_size + 1
        assert counts.mid_call_tokens == tuple(s.mid_catch_up + s.mid_tree_tokens for s in mids)
        assert counts.mid_call_fed == (
            0,
            mids[0].mid_tree_tokens,
            mids[0].mid_tree_tokens + mids[1].mid_tree_tokens,
        )
        assert counts.tree_nodes == rd.tree_size + 1 >= counts.verified_nodes
        assert counts.small_frontier == sum(s.frontier_size for s in rd.steps if not s.used_mid)
        assert counts.small_steps == len(rd.steps) - len(mids) == 2
        assert counts.decisions == len(rd.steps) == 5
        assert math.isfinite(price_round(measured, counts)) and price_round(measured, counts) > 0
    # the first call catches up on the prompt (the root is the prefill's token)
    assert res.rounds[0].steps[0].mid_catch_up == len(prompt)


def test_json_round_trip(tmp_path, measured: LatencyProfile) -> None:
    path = save_profile(measured, tmp_path / "sub" / "tiny.json")
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert load_profile(path) == measured


def test_save_is_atomic(tmp_path, monkeypatch, measured: LatencyProfile) -> None:
    path = tmp_path / "p.json"
    path.write_text("x" * 100_000)
    save_profile(linear_profile(), path)
    assert load_profile(path) == linear_profile()  # replaced whole: no tail of the old content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]
    before = path.read_text()

    def broken_fsync(fd: int) -> None:  # the temporary file is written, not yet renamed
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        save_profile(measured, path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_load_errors_name_the_file(tmp_path) -> None:
    good = json.loads(save_profile(linear_profile(), tmp_path / "good.json").read_text())
    cases = {
        "version.json": ({**good, "schema_version": SCHEMA_VERSION + 1}, "schema_version"),
        "noversion.json": ({k: v for k, v in good.items() if k != "schema_version"}, "schema_version"),
        "missing.json": ({k: v for k, v in good.items() if k != "ar_token_ms"}, "missing key.*ar_token_ms"),
        "unknown.json": ({**good, "extra": 1}, "unknown key.*extra"),
        "badvalue.json": ({**good, "verify_points": []}, "verify_points"),
        "list.json": ([1, 2], "JSON object"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=message) as err:
            load_profile(path)
        assert str(path) in str(err.value)
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"garbage\.json.*not valid JSON"):
        load_profile(tmp_path / "garbage.json")


def test_run_profile_writes_one_file_per_pair(tmp_path, pair, capsys) -> None:
    settings = ProfileParams(
        pairs=("a", "b"),
        out_dir=str(tmp_path / "out"),
        context_len=16,
        warmup=0,
        repeats=1,
        samples_per_repeat=1,
        sizes=(1, 3),
        mid_tokens=(1, 4),
        mid_fed=(0, 2),
    )
    loaded: list[str] = []

    def load(name: str):
        loaded.append(name)
        return pair

    paths = run_profile(settings, load)
    assert loaded == ["a", "b"]
    assert [p.name for p in paths] == ["a.json", "b.json"]
    profiles = [load_profile(p) for p in paths]
    assert [p.pair for p in profiles] == ["a", "b"]
    assert all(p.context_len == 16 and [n for n, _ in p.verify_points] == [1, 3] for p in profiles)
    assert all((p.mid_tokens, p.mid_fed) == ((1, 4), (0, 2)) for p in profiles)
    out = capsys.readouterr().out
    assert out.startswith(format_table(profiles)) and "verify@max" in out
    with pytest.raises(ValueError, match="file name"):
        run_profile(settings.model_copy(update={"pairs": ("../x",)}), load)


def test_run_profile_measures_the_pairs_in_turn_and_keeps_the_median(tmp_path, pair, capsys) -> None:
    settings = ProfileParams(
        pairs=("a", "b"), out_dir=str(tmp_path / "out"), context_len=16, warmup=0, repeats=1,
        samples_per_repeat=1, sizes=(1, 3), mid_tokens=(1, 4), mid_fed=(0, 2), passes=3,
    )  # fmt: skip
    loaded: list[str] = []

    def load(name: str):
        loaded.append(name)
        return pair

    paths = run_profile(settings, load)
    assert loaded == ["a", "b"] * 3  # pass by pass, not pair by pair: a slow spell hits one pass
    profiles = [load_profile(p) for p in paths]
    assert [(p.pair, p.passes, p.repeats) for p in profiles] == [("a", 3, 3), ("b", 3, 3)]
    spread = json.loads((tmp_path / "out" / PASSES_FILE).read_text())
    assert set(spread) == {"a", "b"}
    ratios = [r for rows in spread.values() for per_pass in rows.values() for r in per_pass]
    assert all(len(v) == 3 for rows in spread.values() for v in rows.values()) and min(ratios) > 0
    assert {"verify", "ar", "mid"} <= set(spread["a"])
    assert "pass vs combined profile" in capsys.readouterr().out
    with pytest.raises(ValueError, match="passes must be >= 1"):
        run_profile(settings.model_copy(update={"passes": 0}), load)  # past params' own check


def test_median_profile_outvotes_a_pass_hit_by_a_slow_spell() -> None:
    calm, slow = linear_profile(), linear_profile(scale=2.0)
    combined = median_profile([calm, slow, linear_profile(scale=1.02)])
    # every figure: the median of (x, 2x, 1.02x) is 1.02x, not the slow pass's 2x nor the mean's 1.34x
    for g in compare_profiles(calm, combined):
        assert g.geomean_ratio == pytest.approx(1.02) and g.worst_ratio == pytest.approx(1.02), g.component
    assert (combined.repeats, combined.passes) == (45, 3)
    assert median_profile([calm]) == calm
    two = median_profile([calm, slow])  # an even count: the mean of the middle two
    assert two.ar_token_ms == pytest.approx(1.5 * calm.ar_token_ms)
    moved = dataclasses.replace(calm, verify_points=((1, 2.0), (3, 4.0)))
    with pytest.raises(ValueError, match="differ in verify_points"):
        median_profile([calm, moved])
    with pytest.raises(ValueError, match="differ in context_len"):
        median_profile([calm, dataclasses.replace(calm, context_len=64)])
    with pytest.raises(ValueError, match="at least one pass"):
        median_profile([])
    with pytest.raises(ValueError, match="passes must be an integer >= 1"):
        dataclasses.replace(calm, passes=0)


def test_compare_profiles_finds_the_component_that_moved() -> None:
    a = linear_profile()
    same = compare_profiles(a, linear_profile())
    assert [g.component for g in same] == [
        "verify", "mid", "mid_end", "small", "decision", "ar", "tree", "prompt_block"
    ]  # fmt: skip
    assert all(g.geomean_ratio == pytest.approx(1.0) and g.worst_deviation < 1e-12 for g in same)
    slower = {g.component: g for g in compare_profiles(a, linear_profile(scale=1.1))}
    assert all(g.geomean_ratio == pytest.approx(1.1) for g in slower.values())
    grid = [list(row) for row in a.mid_grid_ms]
    grid[1][2] *= 1.3  # one cell of the mid table drifted
    moved = {g.component: g for g in compare_profiles(a, dataclasses.replace(a, mid_grid_ms=grid))}
    assert moved["mid"].worst_ratio == pytest.approx(1.3) and moved["mid"].n_points == 9
    assert 1.0 < moved["mid"].geomean_ratio < 1.3
    assert moved["verify"].worst_deviation < 1e-12


def test_robust_medians_interleave_and_ignore_spikes() -> None:
    now = [0.0]
    order: list[str] = []

    def job(name: str, cost: float, spike_at: int | None = None) -> Job:
        calls = [0]

        def run(_: object) -> None:
            calls[0] += 1
            order.append(name)
            now[0] += 1000.0 * cost if calls[0] == spike_at else cost

        return Job(lambda: None, run)

    jobs = {
        ("a",): job("a", 0.002, spike_at=4),
        ("b",): job("b", 0.001, spike_at=9),
        ("c",): Job(lambda: None, lambda _: job_c(), 4),
    }

    def job_c() -> None:
        order.append("c")
        now[0] += 0.004  # four units at once: 1 ms each

    ms = robust_medians(jobs, lambda: now[0], warmup=1, repeats=5, passes=3, seed=3)
    assert ms == {("a",): pytest.approx(2.0), ("b",): pytest.approx(1.0), ("c",): pytest.approx(1.0)}
    passes = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert len(passes) == 6 * 3 and all(sorted(p) == ["a", "b", "c"] for p in passes)  # round-robin
    assert len({tuple(p) for p in passes}) > 1  # in a fresh order per pass


def test_robust_medians_sample_a_long_job_once_per_repeat_after_the_first() -> None:
    now = [0.0]
    calls = {"long": 0, "short": 0, "units": 0}

    def timed(name: str, cost: float, units: int = 1) -> Job:
        def run(_: object) -> None:
            calls[name] += 1
            now[0] += cost

        return Job(lambda: None, run, units)

    # "units": 4 units of 3 ms, a 12-ms run: long by its run, not by its 3 ms per unit
    costs = {"long": (0.050, 1), "short": (0.002, 1), "units": (0.012, 4)}
    jobs = {(name,): timed(name, cost, units) for name, (cost, units) in costs.items()}
    ms = robust_medians(jobs, lambda: now[0], warmup=1, repeats=4, passes=3, long_ms=10.0)
    expected = {"long": 50.0, "short": 2.0, "units": 3.0}
    assert {k[0]: v for k, v in ms.items()} == {k: pytest.approx(v) for k, v in expected.items()}
    assert calls == {"long": 3 + 4, "short": 3 * 5, "units": 3 + 4}  # all passes of the first repeat only
    calls.update(long=0, short=0, units=0)
    robust_medians(jobs, lambda: now[0], warmup=1, repeats=4, passes=3)  # long_ms 0: every job every pass
    assert calls == {"long": 15, "short": 15, "units": 15}


def test_fit_small_step() -> None:
    fixed, per_node, mean = fit_small_step({1: 0.12, 5: 0.2, 10: 0.3}, {1: 10, 5: 10, 10: 20})
    assert (fixed, per_node) == (pytest.approx(0.1), pytest.approx(0.02))
    assert mean == pytest.approx((1 * 10 + 5 * 10 + 10 * 20) / 40)
    fixed, per_node, _ = fit_small_step({2: 0.1, 4: 0.3}, {2: 1, 4: 1})  # the line would cross below 0
    assert fixed == 0.0 and per_node == pytest.approx((0.2 + 1.2) / (4 + 16))
    assert fit_small_step({3: 0.5}, {3: 7}) == (pytest.approx(0.5), 0.0, 3.0)


def test_decision_work_is_the_students_shape(pair) -> None:
    import numpy as np

    from decoder.core.policies import BuildState, RuntimeContext, StepContext
    from decoder.core.tree import DraftTree

    student = student_like(5, 10, np.random.default_rng(0))
    assert [w.shape for w, _ in student.net.layers] == [(17, 64), (64, 32), (32, 1)]
    ctx = StepContext(2, 5, (True,), BuildState(DraftTree(3)), RuntimeContext(40, 5.0, 1.0))
    z = student.features(ctx)
    assert z.shape == (17,) and isinstance(student(ctx), bool)


def test_small_frontier_read_off_the_tree_equals_the_steps(pair) -> None:
    import numpy as np

    from decoder.core.construct import RoundBuilder
    from decoder.core.mid import MidDrafter
    from decoder.core.ngram import NgramDrafter
    from decoder.core.policies import FixedSchedule, schedule_bits
    from decoder.core.timing import zero_times

    cfg = DecodeConfig().tree
    context = reference_context(pair, 60)
    seen = set()
    for s in range(32):
        ngram = NgramDrafter.for_tree(cfg)
        ngram.commit(context)
        rows = np.random.default_rng(s).normal(size=(len(context), cfg.topk)).tolist()
        ngram.cache.set_rows(0, [context[1:2] * cfg.topk] * len(context), rows)
        builder = RoundBuilder(cfg, ngram, MidDrafter(pair.mid, pair.vocab_size), lambda: 0.0)
        bits = schedule_bits(s, cfg.depth)
        tree, steps = builder.build(context, FixedSchedule(bits), zero_times())
        want = sum(st.frontier_size for st in steps if not st.used_mid)
        assert small_frontier(tree, bits, cfg.width) == want, bits
        assert small_frontier(tree, bits, cfg.width, sequential=True) == cfg.depth - sum(bits)
        seen.add(want)
    assert len(seen) > 3  # schedules expand different frontiers


def test_ar_job_decodes_what_greedy_ar_decoding_decodes(pair) -> None:
    """The timed AR steps are real greedy steps after the context: the burst's tokens are
    autoregressive decoding's, and the reference caches are rewound between jobs."""
    ctx = reference_context(pair, 33)
    ref = Reference(pair, ctx, TreeConfig())
    want = generate(pair, ctx, "ar", DecodeConfig(max_new_tokens=AR_WARM + AR_BURST + 1)).new_tokens
    for _ in range(2):  # a second burst after a rewind gives the same tokens
        ref.rewind_target()
        token = ar_burst(ref, ctx[-1], 0, AR_WARM)
        assert token == want[AR_WARM - 1]
        assert ar_burst(ref, token, AR_WARM, AR_BURST) == want[AR_WARM + AR_BURST - 1]
