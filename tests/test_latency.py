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

from collectors import latency
from collectors.latency import (
    SCHEMA_VERSION,
    LatencyProfile,
    RoundCounts,
    counts_from_round,
    interpolate,
    load_profile,
    price_ar,
    price_round,
    save_profile,
)
from collectors.profiling import measure_profile, random_tree, reference_context
from config.params import ProfileParams
from decoder.config import DecodeConfig
from decoder.generate import generate
from decoder.models import make_pair
from pipeline.profile import format_table, run_profile

SIZES = (1, 4, 16)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3", seed=21)
    return make_pair(target, noisy_copy(target, 0.3, seed=22), eos_token_ids=())


@pytest.fixture(scope="module")
def measured(pair) -> LatencyProfile:
    return measure_profile(pair, "tiny", context_len=32, sizes=SIZES, warmup=1, repeats=3, overhead_tokens=16)


def linear_profile(scale: float = 1.0, **kw) -> LatencyProfile:
    """Hand-made: verify 2 + 0.5 n ms, mid 1 + 0.25 n ms, all times multiplied by `scale`."""
    fields = dict(
        pair="hand",
        device="cpu",
        device_name="test",
        torch_threads=1,
        torch_version="0",
        dtype="float32",
        context_len=256,
        warmup=3,
        repeats=15,
        verify_points=tuple((n, scale * (2 + 0.5 * n)) for n in (1, 2, 4, 8, 64)),
        mid_points=tuple((n, scale * (1 + 0.25 * n)) for n in (1, 8, 32)),
        ngram_step_ms=scale * 0.1,
        scheduler_ms=scale * 0.01,
        ar_token_ms=scale * 3.0,
        tree_overhead_ms=scale * 0.5,
    )
    return LatencyProfile(**{**fields, **kw})


def test_measured_profile_is_sane(measured: LatencyProfile) -> None:
    assert [n for n, _ in measured.verify_points] == list(SIZES)
    assert [n for n, _ in measured.mid_points] == list(SIZES)
    values = [ms for _, ms in measured.verify_points + measured.mid_points]
    scalars = [measured.ngram_step_ms, measured.scheduler_ms, measured.ar_token_ms, measured.tree_overhead_ms]
    assert all(math.isfinite(v) and v > 0 for v in values + scalars)
    assert (measured.device, measured.dtype, measured.context_len) == ("cpu", "float32", 32)
    assert measured.device_name and measured.torch_threads >= 1
    for n, ms in measured.verify_points:
        assert measured.verify_ms(n) == ms
    for n, ms in measured.mid_points:
        assert measured.mid_ms(n) == ms


def test_pair_without_mid_has_no_mid_costs(pair) -> None:
    solo = make_pair(pair.target, None, eos_token_ids=())
    prof = measure_profile(solo, "solo", context_len=16, sizes=(1, 2), warmup=0, repeats=1, overhead_tokens=8)
    assert prof.mid_points == ()
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
    assert prof.mid_ms(0) == 0.0  # no forward happens
    points = ((2, 5.0), (4, 9.0), (8, 7.0))
    assert interpolate(points, 1) == 5.0  # below the first size: its cost
    assert interpolate(points, 6) == pytest.approx(8.0)
    assert interpolate(points, 100) == 7.0  # a falling last segment is not extended downwards
    assert interpolate(((3, 4.0),), 50) == 4.0
    with pytest.raises(ValueError):
        prof.verify_ms(0)


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
        linear_profile(mid_points=((1, float("nan")),))
    with pytest.raises(ValueError, match="must not be empty"):
        linear_profile(verify_points=())
    with pytest.raises(ValueError, match="ngram_step_ms"):
        linear_profile(ngram_step_ms=-1.0)


def test_price_round_arithmetic() -> None:
    prof = linear_profile()
    counts = RoundCounts(verified_nodes=10, mid_call_tokens=(40, 8, 0), small_steps=2, decisions=5)
    expected = (2 + 0.5 * 10) + (1 + 0.25 * 40) + (1 + 0.25 * 8) + 0.0 + 2 * 0.1 + 5 * 0.01 + 0.5
    assert price_round(prof, counts) == pytest.approx(expected)
    assert price_ar(prof, 7) == pytest.approx(21.0)
    with pytest.raises(ValueError):
        RoundCounts(verified_nodes=0, mid_call_tokens=(), small_steps=0, decisions=0)
    with pytest.raises(ValueError):
        RoundCounts(verified_nodes=1, mid_call_tokens=(-1,), small_steps=0, decisions=0)


def test_repricing_same_counts_scales_with_the_profile() -> None:
    counts = [RoundCounts(64, (70, 12), 3, 5), RoundCounts(1, (), 5, 5), RoundCounts(20, (5,) * 5, 0, 5)]
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
        assert counts.small_steps == len(rd.steps) - len(mids) == 2
        assert counts.decisions == len(rd.steps) == 5
        assert math.isfinite(price_round(measured, counts)) and price_round(measured, counts) > 0
    assert res.rounds[0].steps[0].mid_catch_up == len(prompt) - 1  # the first call catches up


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

    def broken_dump(*args, **kwargs) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(latency.json, "dump", broken_dump)
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
        pairs=("a", "b"), out_dir=str(tmp_path / "out"), context_len=16, warmup=0, repeats=1, sizes=(1, 3)
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
    out = capsys.readouterr().out
    assert out.strip() == format_table(profiles) and "verify@max" in out
    with pytest.raises(ValueError, match="file name"):
        run_profile(dataclasses.replace(settings, pairs=("../x",)), load)
