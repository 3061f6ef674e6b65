"""The wall_check stage's arithmetic: priced / measured per pair and method with a paired bootstrap
over prompts, its verdict against the band, the prompts it takes and the table it writes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from collectors.evaluation import wall_decode
from collectors.evaluation.wall_agreement import (
    PromptTimes,
    agreement_rows,
    agreement_summary,
    agreement_table,
    mark_rows,
    verdict,
)
from collectors.evaluation.wall_decode import pair_prompts, wall_methods
from decoder.core.policies import AR

RNG = np.random.default_rng(5)
AR_S = RNG.uniform(0.5, 3.0, 8)  # eight prompts of very different lengths


def times(decode: np.ndarray, stage: np.ndarray, beside: np.ndarray | None = None) -> PromptTimes:
    given = {"stage": stage} if beside is None else {"stage": stage, "beside": beside}
    priced = {k: np.asarray(v, dtype=float) for k, v in given.items()}
    return PromptTimes(np.asarray(decode, dtype=float), priced)


def test_a_price_proportional_to_the_clock_agrees_exactly_however_much_prompts_differ():
    """Priced ms = 7 x measured s for AR and the method, prompt by prompt: priced / measured is 1
    with a zero-width interval, because both speedups are resampled on the same prompts."""
    method_s = AR_S / RNG.uniform(1.2, 3.0, 8)
    rows = agreement_rows("p", {AR: times(AR_S, 7 * AR_S), "m": times(method_s, 7 * method_s)}, 500)
    (row,) = rows
    assert row["measured_speedup"] == pytest.approx(AR_S.sum() / method_s.sum())
    assert row["measured_ci_low"] < row["measured_speedup"] < row["measured_ci_high"]  # prompts differ
    assert (row["stage_ratio"], row["stage_ci_low"], row["stage_ci_high"]) == pytest.approx((1.0, 1.0, 1.0))
    assert row["stage_verdict"] == "within" and "beside_ratio" not in row
    assert row["n_prompts"] == 8 and row["method"] == "m" and row["pair_id"] == "p"


def test_a_price_off_by_a_fifth_is_outside_the_band_and_the_beside_profile_tells_it_apart():
    """The method priced 1.2x too fast with the stage's profile, with noise per prompt; the beside
    profile prices it right."""
    method_s = AR_S / 2.0
    noise = RNG.uniform(0.97, 1.03, 8)
    stage = 10 * method_s / 1.2 * noise
    rows = agreement_rows(
        "p", {AR: times(AR_S, 10 * AR_S, 10 * AR_S), "m": times(method_s, stage, 10 * method_s)}, 500
    )
    (row,) = rows
    assert row["stage_priced_speedup"] == pytest.approx((10 * AR_S).sum() / stage.sum())
    assert row["stage_ratio"] == pytest.approx(row["stage_priced_speedup"] / row["measured_speedup"])
    assert row["stage_ci_low"] <= row["stage_ratio"] <= row["stage_ci_high"]
    assert row["stage_ci_low"] > 1.1 and row["stage_verdict"] == "outside"
    assert row["beside_ratio"] == pytest.approx(1.0) and row["beside_verdict"] == "within"


def test_one_prompt_has_its_point_for_an_interval():
    (row,) = agreement_rows("p", {AR: times([2.0], [20.0]), "m": times([1.0], [12.0])}, 100)
    assert (row["stage_ratio"], row["stage_ci_low"], row["stage_ci_high"]) == pytest.approx(
        (20 / 12 / 2,) * 3
    )
    assert row["measured_ci_low"] == row["measured_ci_high"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [(0.9, 1.1, "within"), (0.95, 1.05, "within"), (0.5, 0.89, "outside"), (1.11, 1.3, "outside"),
     (0.85, 0.95, "unresolved"), (1.05, 1.2, "unresolved"), (0.8, 1.2, "unresolved")],
)  # fmt: skip
def test_verdict_against_the_band(low: float, high: float, expected: str):
    assert verdict(low, high) == expected


def _row(pair: str, method: str, ratio: float, low: float, high: float, **extra) -> dict:
    return {"pair_id": pair, "method": method, "n_prompts": 8, "measured_speedup": 2.0,
            "measured_ci_low": 1.8, "measured_ci_high": 2.2, "stage_priced_speedup": 2.0 * ratio,
            "stage_ratio": ratio, "stage_ci_low": low, "stage_ci_high": high,
            "stage_verdict": verdict(low, high), **extra}  # fmt: skip


def test_summary_counts_the_verdicts_and_the_points_in_the_band():
    rows = [_row("a", "m", 1.0, 0.95, 1.05), _row("a", "n", 1.08, 1.0, 1.15), _row("b", "m", 0.7, 0.6, 0.8)]
    got = agreement_summary(rows)
    assert list(got) == ["stage"]  # no row has a beside figure
    assert got["stage"] == {"rows": 3, "within": 1, "outside": 1, "unresolved": 1,
                            "ci_within_share": pytest.approx(1 / 3),
                            "point_within_share": pytest.approx(2 / 3),
                            "min": 0.7, "median": 1.0, "max": 1.08}  # fmt: skip
    assert agreement_summary([]) == {}


def test_the_table_shows_each_pair_and_method_with_its_interval_and_verdict():
    rows = mark_rows(
        [_row("a", "student", 1.02, 0.97, 1.07), _row("a", "all-small", 0.8, 0.7, 0.85)],
        {"a": "student"},
        [],
        [{"pair_id": "a", "method": "student", "priced_speedup": 2.0},
         {"pair_id": "a", "method": "student", "priced_speedup": 3.0}],
    )  # fmt: skip
    lines = agreement_table(rows).splitlines()
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    assert cells[0][:4] == ["pair", "method", "deployed", "prompts"] and len(cells[0]) == 10
    assert set(lines[1]) <= set("|-: ")
    assert cells[2] == ["a", "student", "yes", "8", "2.00x", "[1.80, 2.20]", "2.04x",
                        "1.02 [0.97, 1.07] within", "-", "2.50x"]  # fmt: skip
    assert cells[3][:3] == ["a", "all-small", ""] and cells[3][7] == "0.80 [0.70, 0.85] outside"
    assert cells[3][-1] == "-"  # evaluate has no such row


def test_mark_rows_names_the_deployed_method_and_the_held_out_pairs():
    rows = [
        _row("a", "student", 1.0, 0.9, 1.1),
        _row("b", "deployed", 1.0, 0.9, 1.1),
        _row("b", "student", 1, 1, 1),
    ]
    got = mark_rows(rows, {"a": "student", "b": "student:-0.50"}, ["b"], [])
    assert [r["is_deployed"] for r in got] == [True, True, False]
    assert [r["is_held_out_pair"] for r in got] == [False, True, True]


def test_wall_methods_take_learned_policies_by_name_and_fixed_schedules_by_bits():
    student = object()
    got = wall_methods(["all-small", "student", "10101"], {"student": student}, 5)
    assert [(m.name, m.policy) for m in got] == [
        ("all-small", "all-small"),
        ("student", student),
        ("10101", "10101"),
    ]
    for bad in ("value-planer", "1010", "ddtree"):  # unknown, the wrong depth, not a fixed schedule
        with pytest.raises(ValueError, match=rf"wall_check.methods: '{bad}' is neither a learned policy"):
            wall_methods([bad], {"student": student}, 5)


def test_pair_prompts_go_round_robin_over_the_datasets(monkeypatch):
    """Seven prompts over three datasets: a0 b0 c0 a1 b1 c1 a2, each dataset asked for its count."""
    asked = {}

    def cell_inputs(params, pair_id, dataset, pair, n):
        asked[dataset] = n
        return (
            [f"{dataset}{j}" for j in range(n)],
            [[j] for j in range(n)],
            f"profile {pair_id}",
            list(range(n)),
        )

    monkeypatch.setattr(wall_decode, "cell_inputs", cell_inputs)
    params = SimpleNamespace(evaluate=SimpleNamespace(datasets=("a", "b", "c")))
    questions, prompts, profile, runtimes = pair_prompts(params, "p", None, 7)
    assert questions == ["a0", "b0", "c0", "a1", "b1", "c1", "a2"]
    assert asked == {"a": 3, "b": 2, "c": 2} and profile == "profile p"
    assert prompts == [[0], [0], [0], [1], [1], [1], [2]] and runtimes == [0, 0, 0, 1, 1, 1, 2]
    asked.clear()
    assert pair_prompts(params, "p", None, 2)[0] == ["a0", "b0"] and asked == {"a": 1, "b": 1}


def test_the_parent_runs_headline_reads_the_names_evaluate_and_wall_check_write():
    """The headline patterns match what the stages log (flattened, as pipeline.tracking.log_metrics
    does, and prefixed with the stage, as a parent run holds them)."""
    from collectors.evaluation.eval_report import summary_metrics
    from pipeline.headline import headline_metrics
    from pipeline.provenance import flatten

    def row(method: str, priced: float) -> dict:
        return {"pair_id": "a", "dataset_id": "x", "method": method, "priced_speedup": priced,
                "mean_accepted_length": 1.5, "is_held_out_pair": False, "is_held_out_task": False,
                "mid_calls_per_step": [0.5]}  # fmt: skip

    deployed = {**row("student", 2.2), "method": "deployed", "deployed_as": "student"}
    evaluate = summary_metrics([row("all-small", 2.0), row("all-mid", 1.0), row("student", 2.2), deployed])
    wall = {"summary": agreement_summary([_row("a", "m", 1.0, 0.95, 1.05), _row("a", "n", 0.7, 0.6, 0.8)])}
    logged = {f"{stage}/{k}": v for stage, m in (("evaluate", evaluate), ("wall_check", wall))
              for k, v in flatten(m).items() if isinstance(v, int | float)}  # fmt: skip
    got = headline_metrics(logged)
    assert got["headline/deployed_gain_fitting_mean"] == pytest.approx(1.1)
    assert got["headline/deployed_gain_fitting_worst"] == pytest.approx(1.1)
    assert got["headline/pricing_ci_within_share"] == pytest.approx(0.5)


def test_a_pair_decodes_more_prompts_until_every_row_is_resolved(monkeypatch):
    """8 prompts a batch, up to 24: a row unresolved at 8 prompts brings a second batch, resolved at
    16 it stops there; never resolved, it stops at 24; resolved at once, one batch. The answers and
    the lossless counts of every batch add up."""
    calls: list[list[int]] = []

    def cell(pair, questions, prompts, methods, config, runtimes, profile, warmup, beside, repeats, lockstep):
        calls.append([p[0] for p in prompts])
        res = [SimpleNamespace(wall_s=2.0, prefill_s=0.5) for _ in prompts]
        summary = {"dtype": "float32", "prompts": len(prompts), "sequence_agreement": 1.0,
                   "token_agreement": 1.0, "tokens_compared": 8 * len(prompts), "near_ties": 1,
                   "real_mismatches": 0}  # fmt: skip
        return SimpleNamespace(results={AR: res, "m": res}, answers={AR: [{}] * len(prompts)},
                               lossless={AR: summary, "m": summary})  # fmt: skip

    def rows_resolved_at(n: int):
        def rows(pair_id, times, n_boot):
            done = len(times[AR].decode_s)
            return [
                {"method": "m", "n_prompts": done, "stage_verdict": "within" if done >= n else "unresolved"}
            ]

        return rows

    questions = [SimpleNamespace(dataset="d") for _ in range(24)]
    monkeypatch.setattr(wall_decode, "load_registered_pair", lambda params, pair_id: None)
    monkeypatch.setattr(
        wall_decode,
        "pair_prompts",
        lambda p, i, pair, n: (questions[:n], [[k] for k in range(n)], "P", list(range(n))),
    )
    monkeypatch.setattr(
        wall_decode, "decode_config", lambda params, pair_id: SimpleNamespace(tree=SimpleNamespace(depth=5))
    )
    monkeypatch.setattr(wall_decode, "profile_beside", lambda params, pair, pair_id: "B")
    monkeypatch.setattr(wall_decode, "profile_drift", lambda stage, beside: {})
    monkeypatch.setattr(wall_decode, "evaluate_cell", cell)
    monkeypatch.setattr(
        wall_decode,
        "prompt_times",
        lambda res, policy, profiles: times([r.wall_s for r in res], [1.0] * len(res)),
    )
    params = SimpleNamespace(wall_check=SimpleNamespace(prompts_per_pair=8, most_prompts_per_pair=24,
                                                        order="lockstep", bootstrap=100))  # fmt: skip
    for resolved_at, batches in ((16, 2), (99, 3), (8, 1)):
        calls.clear()
        monkeypatch.setattr(wall_decode, "agreement_rows", rows_resolved_at(resolved_at))
        got = wall_decode.check_pair(params, "p", ["m"], {"m": "a policy"}, None)
        assert calls == [list(range(8 * b, 8 * b + 8)) for b in range(batches)]
        assert got.rows[0]["n_prompts"] == 8 * batches and len(got.answers[(AR, "d")]) == 8 * batches
        assert got.lossless["m"]["prompts"] == 8 * batches and got.lossless["m"]["near_ties"] == batches


def test_merged_lossless_weights_token_agreement_by_tokens_compared():
    """Two batches: 1 prompt of 100 tokens agreeing on 50, then 3 prompts of 10 tokens agreeing on
    all. Over the tokens, 80 of 130 agree (0.615); weighting each batch's share by its prompts would
    give (0.5 + 3 * 1.0) / 4 = 0.875. Sequence agreement stays a share of prompts."""
    first = {"dtype": "float32", "prompts": 1, "sequence_agreement": 0.0, "token_agreement": 0.5,
             "tokens_compared": 100, "near_ties": 0, "real_mismatches": 1}  # fmt: skip
    second = {**first, "prompts": 3, "sequence_agreement": 1.0, "token_agreement": 1.0,
              "tokens_compared": 30, "real_mismatches": 0}  # fmt: skip
    merged = wall_decode.merge_lossless({"m": [first, second]})["m"]
    assert merged["token_agreement"] == pytest.approx(80 / 130)
    assert merged["sequence_agreement"] == pytest.approx(0.75)
    assert merged["prompts"] == 4 and merged["tokens_compared"] == 130 and merged["real_mismatches"] == 1
