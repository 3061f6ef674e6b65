"""benchmarks/bench_never_loses.py runs end to end on a tiny pair by path and a two-question file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import noisy_copy, tiny_model, train_tokenizer
from markdown_rows import md_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_never_loses


def test_the_benchmark_reports_every_prompt_in_both_dtypes(tmp_path):
    tok = train_tokenizer([f"def f{i}(x):\n    return x * {i}\n" * 3 for i in range(100)], 96)
    target = tiny_model("qwen3", seed=71)
    for name, model in (("target", target), ("mid", noisy_copy(target, 0.3, seed=72))):
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    questions = tmp_path / "bench" / "question.jsonl"
    questions.parent.mkdir()
    rows = [("coding", "def f3(x): return x * 3 def f3(x):"), ("math", "return x * 7 return")]
    questions.write_text(
        "".join(
            json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n"
            for i, (c, t) in enumerate(rows)
        )
    )
    out = tmp_path / "never"
    bench_never_loses.main(
        ["--target", str(tmp_path / "target"), "--mid", str(tmp_path / "mid"), "--template", "zoo",
         "--questions", str(questions), "--max-new-tokens", "10", "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    assert [d["dtype"] for d in report["dtypes"]] == ["float32", "bfloat16"]
    for info in report["dtypes"]:
        assert [r["category"] for r in info["rows"]] == ["bench/coding", "bench/math"]
        assert info["min_ratio"] == min(r["ratio"] for r in info["rows"]) > 0
        assert info["min_cpu_ratio"] == min(r["cpu_ratio"] for r in info["rows"]) > 0
        assert info["rss_peak_gib"] >= info["rss_loaded_gib"] > 0
        assert all(r["output"] in ("identical", "near-tie", "mismatch") for r in info["rows"])
        assert all(r["rounds_verified"] + r["rounds_as_ar"] >= 1 for r in info["rows"])
        # --repeats 3 by default: every prompt has a paired interval around its point
        assert all(r["paired_low"] <= r["paired_ratio"] <= r["paired_high"] for r in info["rows"])
        assert sum(info["paired_floor"].values()) == len(info["rows"])
    assert all(r["output"] == "identical" for r in report["dtypes"][0]["rows"])  # fp32 is exact
    tables = md_tables(out.with_suffix(".md").read_text())  # one per dtype
    assert [[r[0] for r in t[1:]] for t in tables] == [["bench/coding 0", "bench/math 1"]] * 2


def runs(*walls: float) -> list:
    return [SimpleNamespace(wall_s=w) for w in walls]


def test_paired_runs_place_a_prompt_against_the_floor_only_when_its_interval_does():
    ar = runs(1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 0.95, 1.05)
    slower = bench_never_loses.paired_runs(ar, runs(*(1.25 * r.wall_s for r in ar)))
    assert slower["paired_floor"] == "under"
    assert abs(slower["paired_ratio"] - 0.8) < 1e-9 and slower["paired_high"] < 0.97
    level = bench_never_loses.paired_runs(ar, runs(*(r.wall_s for r in ar)))
    assert level["paired_floor"] == "at or above" and level["paired_low"] == level["paired_high"] == 1.0
    # the same medians, but pairs that disagree run to run: the interval spans the floor
    noisy = bench_never_loses.paired_runs(runs(1, 1, 1, 1, 1, 1), runs(0.8, 1.2, 0.85, 1.15, 0.9, 1.1))
    assert noisy["paired_floor"] == "undecided"
    assert noisy["paired_low"] < 0.97 <= noisy["paired_high"]


def test_settle_times_only_undecided_prompts_again_until_decided_or_capped(monkeypatch):
    batches = []  # (prompt, runs asked for) per extra call

    def fake_side_by_side(pair, prompts, methods, config, runtime, **kw):
        (prompt,) = prompts
        n = kw["repeats"].most
        batches.append((prompt, n))
        # the noisy prompt's pairs keep disagreeing run to run; the others' agree
        policy = [0.8, 1.2] * (n // 2) + [1.0] * (n % 2) if prompt == "noisy" else [1.0] * n
        kw["every_run"][bench_never_loses.AR] = [runs(*[1.0] * n)]
        kw["every_run"][bench_never_loses.POLICY] = [runs(*policy)]

    monkeypatch.setattr(bench_never_loses, "run_side_by_side", fake_side_by_side)
    args = bench_never_loses.parse_args(["--pair", "x", "--repeats", "6", "--most-repeats", "20"])
    first, noisy = [0.9, 1.1, 0.92, 1.08, 0.94, 1.06], [0.8, 1.2, 0.85, 1.15, 0.9, 1.1]
    ar_runs = [runs(*[1.0] * 6), runs(*[1.0] * 6), runs(*[1.0] * 6)]
    pol_runs = [runs(*first), runs(*[1.0] * 6), runs(*noisy)]
    ar, res = [r[0] for r in ar_runs], [r[0] for r in pol_runs]
    floors = [
        bench_never_loses.paired_runs(a, r)["paired_floor"] for a, r in zip(ar_runs, pol_runs, strict=True)
    ]
    assert floors == ["undecided", "at or above", "undecided"]
    method = bench_never_loses.Method(bench_never_loses.POLICY, "all-small")
    prompts = ["steady", "decided", "noisy"]
    bench_never_loses.settle(None, prompts, method, None, args, (ar, res), (ar_runs, pol_runs))
    # the decided prompt is left alone; the others go on in batches of --repeats, the last one short
    assert [p for p, _ in batches if p == "decided"] == []
    assert [n for p, n in batches if p == "noisy"] == [6, 6, 2] and len(pol_runs[2]) == 20
    assert bench_never_loses.paired_runs(ar_runs[2], pol_runs[2])["paired_floor"] == "undecided"
    steady = bench_never_loses.paired_runs(ar_runs[0], pol_runs[0])
    assert steady["paired_floor"] == "at or above" and len(pol_runs[0]) == 18
    assert len(ar_runs[0]) == len(pol_runs[0])  # AR and the policy stay paired run for run
    # the medians are taken afresh over every run: the steady prompt's is now one of the 1.0 runs
    assert res[0].wall_s == 1.0 and res[1] is pol_runs[1][0]


def test_most_repeats_below_repeats_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        bench_never_loses.parse_args(["--pair", "x", "--repeats", "6", "--most-repeats", "3"])
    assert "--most-repeats (3) must be at least --repeats (6)" in capsys.readouterr().err
