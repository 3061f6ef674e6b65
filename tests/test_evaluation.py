"""The evaluate stage's logic: side-by-side cells, the lossless gate, tables and gains."""

from __future__ import annotations

import pytest
from conftest import noisy_copy, tiny_model
from test_latency import linear_profile

from collectors.data.prompts import Question
from collectors.evaluation import cell as evaluation
from collectors.evaluation.cell import LosslessError, best_fixed_in_hindsight, evaluate_cell
from collectors.evaluation.eval_report import ablation_table, main_table, student_gains, summary_metrics
from decoder import measure
from decoder.core.config import DecodeConfig
from decoder.core.outcome import GenerationResult
from decoder.core.policies import RuntimeContext
from decoder.measure import Method
from decoder.models.pair import make_pair

PROFILE = linear_profile()


@pytest.fixture(scope="module")
def cell_inputs():
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9]]
    questions = [Question("toy", i, "demo", (f"q{i}",)) for i in range(len(prompts))]
    return pair, questions, prompts


def test_cell_rows_for_every_method(cell_inputs):
    pair, questions, prompts = cell_inputs
    config = DecodeConfig(max_new_tokens=16)
    methods = [Method("all-small", "all-small"), Method("all-mid", "all-mid"), Method("10101", "10101")]
    cell = evaluate_cell(pair, questions, prompts, methods, config, RuntimeContext(10, 4.0, 1.0), PROFILE)
    rows = {r["method"]: r for r in cell.rows}
    assert set(rows) == {"ar", "all-small", "all-mid", "10101"}
    assert rows["ar"]["speedup"] == pytest.approx(1.0) and rows["ar"]["priced_speedup"] == pytest.approx(1.0)
    assert rows["all-mid"]["mid_calls_per_step"] == [1.0] * 5 and rows["all-small"]["mid_call_rate"] == 0
    assert rows["10101"]["mid_calls_per_step"] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert all(r["n_tokens"] == 32 for r in rows.values())
    answer = cell.answers["10101"][0]
    assert answer["choices"][0]["new_tokens"] == [16] and answer["question_id"] == 0


def test_a_method_that_differs_from_autoregressive_fails_the_cell(cell_inputs, monkeypatch):
    pair, questions, prompts = cell_inputs
    real = evaluation.run_side_by_side

    def tampered(*args, **kwargs):
        results = real(*args, **kwargs)
        r = results["all-small"][0]
        results["all-small"][0] = GenerationResult(
            [*r.new_tokens[:-1], 1], r.rounds, r.prefill_s, r.wall_s, False
        )
        return results

    monkeypatch.setattr(evaluation, "run_side_by_side", tampered)
    with pytest.raises(LosslessError, match="all-small"):
        evaluate_cell(
            pair,
            questions,
            prompts,
            [Method("all-small", "all-small")],
            DecodeConfig(max_new_tokens=8),
            RuntimeContext(10, 4.0, 1.0),
            PROFILE,
        )


def test_rows_priced_again_with_a_profile_measured_beside_the_decodes(cell_inputs):
    """The same counts priced with a second profile: the same profile gives the same speedups; one
    where every cost took twice as long (a slower machine) too, as speedups are ratios; one where
    only the mid drafter got dearer slows All-Mid's price and leaves All-Small's (no mid calls)."""
    pair, questions, prompts = cell_inputs
    config = DecodeConfig(max_new_tokens=12)
    methods = [Method("all-small", "all-small"), Method("all-mid", "all-mid")]
    grid = tuple(tuple(3 * ms for ms in row) for row in PROFILE.mid_grid_ms)
    dear_mid = linear_profile(mid_grid_ms=grid)
    runtime = RuntimeContext(10, 4.0, 1.0)
    speedups = {}
    for name, beside in (("same", PROFILE), ("slower", linear_profile(2.0)), ("dear mid", dear_mid)):
        cell = evaluate_cell(pair, questions, prompts, methods, config, runtime, PROFILE, beside=beside)
        speedups[name] = {r["method"]: (r["priced_speedup"], r["beside_priced_speedup"]) for r in cell.rows}
    for name in ("same", "slower"):
        assert all(beside == pytest.approx(priced) for priced, beside in speedups[name].values()), name
    small, mid = speedups["dear mid"]["all-small"], speedups["dear mid"]["all-mid"]
    assert small[1] == pytest.approx(small[0]) and mid[1] < 0.9 * mid[0]
    plain = evaluate_cell(pair, questions, prompts, methods, config, runtime, PROFILE)
    assert all("beside_priced_speedup" not in r for r in plain.rows)


def test_a_lockstep_cell_decodes_round_by_round_and_prices_the_same_counts(cell_inputs, monkeypatch):
    """wall_check's order: the cell's methods decode together, one round each in turn, and give
    the same tokens and priced rows as one decode after another (pricing reads counts, not time)."""
    pair, questions, prompts = cell_inputs
    config = DecodeConfig(max_new_tokens=12)
    methods = [Method("all-small", "all-small"), Method("10101", "10101")]
    runtime = RuntimeContext(10, 4.0, 1.0)
    stepped = []
    real = measure.run_lockstep
    monkeypatch.setattr(
        measure, "run_lockstep", lambda decodes, clock: stepped.append(len(decodes)) or real(decodes, clock)
    )
    apart = evaluate_cell(pair, questions, prompts, methods, config, runtime, PROFILE)
    assert stepped == []
    together = evaluate_cell(pair, questions, prompts, methods, config, runtime, PROFILE, lockstep=True)
    assert stepped == [3] * len(prompts)  # AR and both methods, once per prompt
    for name, results in together.results.items():
        assert [r.new_tokens for r in results] == [r.new_tokens for r in apart.results[name]]
    priced = {r["method"]: r["priced_speedup"] for r in apart.rows}
    assert {r["method"]: r["priced_speedup"] for r in together.rows} == pytest.approx(priced)


def test_best_fixed_in_hindsight_is_a_schedule(cell_inputs):
    pair, _, prompts = cell_inputs
    best = best_fixed_in_hindsight(pair, prompts, DecodeConfig(max_new_tokens=12), PROFILE)
    assert len(best) == 5 and set(best) <= {"0", "1"}


def _row(pair, dataset, method, speedup, held_pair=False, held_task=False):
    return {
        "pair_id": pair,
        "dataset_id": dataset,
        "method": method,
        "speedup": speedup,
        "priced_speedup": speedup,
        "mean_accepted_length": 1.0,
        "mid_pool_mean": 3.0,
        "historical_pick_share": 0.5,
        "is_held_out_pair": held_pair,
        "is_held_out_task": held_task,
    }


def test_gains_tables_and_groups():
    rows = []
    for pair, dataset, held, student in (("a", "x", False, 1.2), ("b", "x", True, 0.9)):
        rows += [
            _row(pair, dataset, "all-small", 1.0, held),
            _row(pair, dataset, "all-mid", 0.5, held),
            _row(pair, dataset, "student", student, held),
        ]
    gains = student_gains(rows)
    assert gains["fitting"] == [pytest.approx(1.2)] and gains["held-out pair"] == [pytest.approx(0.9)]
    table = main_table(rows)
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    assert lines[2][:3] == ["a", "x", "fitting"] and "+20.0%" in table and "-10.0%" in table
    assert summary_metrics(rows)["priced_speedup.fitting"]["student_gain_worst"] == pytest.approx(1.2)
    ablation = ablation_table([_row("a", "x", "full", 1.1)]).splitlines()[2]
    assert [c.strip() for c in ablation.strip("|").split("|")][:4] == ["a", "x", "full", "1.10x"]
