"""The student: the paper's 3,265 parameters, stake-weighted objectives, thresholds and cross-fitting
that never use the held-out fold."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from collectors.collect.pool import WorkerPool
from config.params import TrainConfig
from decoder.core.state import SIGNAL_NAMES, state_feature_names
from decoder.deploy.planning import suffix_feature_names
from models.cross_fit import FoldInputs, StudentSpec, TrainRows, cross_fit, pool_fitter
from models.mlp import count_parameters
from models.offline import (
    Replay,
    choose_threshold,
    choose_threshold_walked,
    pair_offset_decisions,
    walked_pct_of_best,
)
from models.student import PAPER_STUDENT_PARAMS, Student, objective, student_param_count
from models.training import fit_weighted, predict


def test_student_has_3265_parameters():
    assert count_parameters(Student(17, (64, 32))) == PAPER_STUDENT_PARAMS == 3_265


@pytest.mark.parametrize(("in_dim", "hidden"), [(17, (64, 32)), (5, (3,)), (9, (4, 7, 2)), (1, ())])
def test_parameter_formula_matches_the_module(in_dim, hidden):
    """distill checks a trained student against the formula; it must agree with torch's count."""
    assert student_param_count(in_dim, hidden) == count_parameters(Student(in_dim, hidden))


def test_student_input_is_the_state_without_the_suffix():
    names = state_feature_names(5, SIGNAL_NAMES[:6])
    assert len(names) == 17  # 4 context + 7 history (D = 5) + 6 signals
    assert not set(names) & set(suffix_feature_names(5))
    model = Student(len(names), (64, 32))
    assert model(torch.zeros(2, 17)).shape == (2, 1)
    with pytest.raises(RuntimeError):  # a value-system row (z + suffix encoding) does not fit
        model(torch.zeros(2, 17 + len(suffix_feature_names(5))))


FAST = TrainConfig(epochs=15, batch_size=16, lr=0.01, weight_decay=0.0, seed=0)


def test_objectives_weigh_states_by_their_stake():
    m = np.array([-2.0, -0.1, 0.0, 0.5, 1.6])
    assert np.all(objective(m, "mse").weight == 1)
    w = objective(m, "weighted_mse")
    np.testing.assert_allclose(w.weight, np.abs(m) / np.abs(m).mean())
    logit = objective(m, "weighted_logistic")
    assert logit.is_logistic and logit.target.tolist() == [0, 0, 0, 1, 1]
    np.testing.assert_allclose(logit.weight, w.weight)
    with pytest.raises(ValueError):
        objective(m, "hinge")


@pytest.mark.parametrize("logistic", [False, True])
def test_zero_weight_rows_do_not_move_the_fit(logistic):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 17))
    y = (x[:, 0] > 0).astype(float) if logistic else x[:, 0]
    w = np.where(np.arange(64) < 48, 1.0, 0.0)
    y2 = y.copy()
    y2[48:] = 1 - y2[48:] if logistic else y2[48:] + 100
    a = fit_weighted(lambda: Student(17), x, y, w, FAST, logistic=logistic).module
    b = fit_weighted(lambda: Student(17), x, y2, w, FAST, logistic=logistic).module
    np.testing.assert_allclose(predict(a, x), predict(b, x), atol=1e-6)


def test_threshold_is_non_negative_and_prefers_skipping_when_unsure():
    regret = np.array([-0.3, -0.02, 0.01, 0.2, 0.4])  # states' realised margins / best tok/s
    scores = np.array([-1.0, 0.3, 0.5, 0.9, 2.0])
    # t = 0.3 decides every state right; t = 0.5 gets the 0.01 state wrong: 0.2 points of mean regret.
    assert choose_threshold(scores, regret, tolerance_pct=0.0) == pytest.approx(0.3)
    assert choose_threshold(scores, regret, tolerance_pct=0.25) == pytest.approx(0.5)
    # Scores that rank the states backwards: invoking nowhere (largest t) is the least regret.
    assert choose_threshold(-scores + 1, regret, tolerance_pct=0.0) == pytest.approx(2.0)
    assert choose_threshold(-np.abs(scores), regret, tolerance_pct=0.0) == 0.0  # t never < 0


def _chooser(regret):
    return lambda scores, train, models: choose_threshold(scores[train], regret[train], 0.0)


def test_cross_fit_never_uses_the_held_out_fold():
    rng = np.random.default_rng(0)
    report = np.repeat(np.arange(6), 7)  # 6 reports of 7 states, 2 reports per fold
    odd = (report % 2).astype(float)
    z = np.column_stack([odd + 0.1 * rng.normal(size=len(report)), rng.normal(size=(len(report), 16))])
    margin = np.where(odd > 0, 0.2, -0.2) + 0.05 * rng.normal(size=len(report))
    folds = report % 3
    spec = StudentSpec("weighted_logistic", (64, 32), FAST, 0.0, nested_threshold=True)
    base = cross_fit([FoldInputs(z, margin)] * 3, folds, _chooser(margin), spec)
    assert len(base.thresholds) == 3 and min(base.thresholds) >= 0
    held = folds == 0
    flipped = np.where(held, -margin, margin)  # fold 0's targets and regrets flipped, inputs kept
    again = cross_fit([FoldInputs(z, flipped)] * 3, folds, _chooser(flipped), spec)
    np.testing.assert_allclose(again.scores[held], base.scores[held], atol=1e-6)
    assert again.thresholds[0] == base.thresholds[0]
    assert not np.allclose(again.scores[~held], base.scores[~held])  # the other folds trained on it


@pytest.mark.slow
def test_cross_fit_in_worker_processes_gives_the_same_students_to_the_bit():
    rng = np.random.default_rng(3)
    report = np.repeat(np.arange(6), 7)
    z = rng.normal(size=(len(report), 5))
    margin = z[:, 0] - 0.3 + 0.1 * rng.normal(size=len(report))
    folds = report % 3
    # fold 2 also trains on extra rows of its own (as the round-level set does)
    extra = TrainRows(rng.normal(size=(60, 5)), rng.normal(size=60), np.arange(60) % 3)
    inputs = [FoldInputs(z, margin), FoldInputs(z, -margin), FoldInputs(z, margin, extra)]
    spec = StudentSpec("weighted_logistic", (8,), FAST, 0.0, nested_threshold=True)
    here = cross_fit(inputs, folds, _chooser(margin), spec)
    with WorkerPool(2, 1) as pool:
        there = cross_fit(inputs, folds, _chooser(margin), spec, pool_fitter(pool))
        again = cross_fit(inputs, folds, None, replace(spec, nested_threshold=False), pool_fitter(pool))
    np.testing.assert_array_equal(there.scores, here.scores)
    assert there.thresholds == here.thresholds and min(here.thresholds) >= 0
    np.testing.assert_array_equal(there.decisions, here.decisions)
    for a, b in zip(there.models, here.models, strict=True):
        for pa_, pb in zip(a.module.parameters(), b.module.parameters(), strict=True):
            assert torch.equal(pa_, pb)
    assert [c.train_loss for c in there.curves.values()] == [c.train_loss for c in here.curves.values()]
    # the pool served a second batch; with threshold 0 the outer fits are the nested run's own
    np.testing.assert_array_equal(again.scores, here.scores)
    assert again.thresholds == (0.0, 0.0, 0.0)


def _replay_two_steps() -> Replay:
    """One report, D = 2: the best schedule is 10 (invoke, then skip)."""
    tps = {"00": 100.0, "01": 90.0, "10": 120.0, "11": 80.0}
    index = {("r", 1, ""): 0, ("r", 2, "0"): 1, ("r", 2, "1"): 2}
    return Replay.build(index, {("r", s): t for s, t in tps.items()})


def test_walked_threshold_keeps_the_call_that_the_per_state_rule_drops():
    """The per-state rule's tolerance is on a mean over every state, so one decisive state's loss
    is diluted and skipping everywhere looks near-best; the walked rule pays what the walk pays."""
    replay = _replay_two_steps()
    scores = np.array([0.8, -1.0, 0.5])  # invoke at step 1 (right), skip at step 2 after "1" (right)
    regret = np.array([20 / 120, -10 / 100, -40 / 120])  # best invoke - best skip, / best of the two
    # t = 0.5 decides every state right (walk 10 = the best, 100%); t = 0.8 skips everywhere
    # (walk 00: 83.3% of best), wrong on one state of three: 5.6 points of mean per-state regret.
    assert choose_threshold(scores, regret, tolerance_pct=6.0) == pytest.approx(0.8)
    assert choose_threshold_walked(scores, replay, ["r"], 2, tolerance_pct=6.0) == pytest.approx(0.5)
    assert walked_pct_of_best(scores > 0.8, replay, ["r"], 2) == pytest.approx(100 * 100 / 120)
    # a tolerance wider than the gap: the largest t within it (when unsure, skip)
    assert choose_threshold_walked(scores, replay, ["r"], 2, tolerance_pct=20.0) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="no score"):
        choose_threshold_walked(np.array([0.8, np.nan, 0.5]), replay, ["r"], 2, 0.0)


def _one_step_replay(best: dict[str, str]) -> Replay:
    """Depth 1: one state per report (its id in sorted report order); the best schedule per report
    realises 10 tok/s, the other 5."""
    index = {(r, 1, ""): i for i, r in enumerate(sorted(best))}
    throughput = {(r, s): 10.0 if s == b else 5.0 for r, b in best.items() for s in "01"}
    return Replay.build(index, throughput)


def test_a_reports_pair_threshold_comes_from_the_pairs_other_reports():
    """Pair a: a1 should skip (score 0.4), a2 and a3 invoke (0.8). For a1, the others invoke at every
    offset up to +0.5: a tie, so the largest (when unsure, skip), and a1 then skips. For a2 (and a3),
    +0.5 alone gets both others right. b1, its pair's only report, keeps offset 0. Flipping a1's own
    outcome changes nothing of its offset: it never sees its own report."""
    pairs = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}
    scores, thresholds = np.array([0.4, 0.8, 0.8, 0.1]), np.zeros(4)
    replay = _one_step_replay({"a1": "0", "a2": "1", "a3": "1", "b1": "0"})
    decisions, offsets = pair_offset_decisions(scores, thresholds, replay, pairs, 1)
    assert offsets == {"a1": 0.5, "a2": 0.5, "a3": 0.5, "b1": 0.0}
    assert decisions.tolist() == [False, True, True, True]
    flipped = _one_step_replay({"a1": "1", "a2": "1", "a3": "1", "b1": "0"})
    _, again = pair_offset_decisions(scores, thresholds, flipped, pairs, 1)
    assert again["a1"] == 0.5  # a2 and a3 unchanged
    assert again["a2"] == again["a3"] == 0.0  # a1 invokes now too: every offset up to 0 fits both others
    with pytest.raises(ValueError, match="include 0"):
        pair_offset_decisions(scores, thresholds, replay, pairs, 1, offsets=(0.5, 1.0))
