"""The pair check's per-pair thresholds: the exported student at shifted thresholds decides where
its shifted threshold says (gate included), is validated like the exported one, and the check
(collectors/evaluation/pair_check.py) keeps the exported threshold unless another option wins by
more than its paired interval."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_priced_eval import _cell_of
from test_scheduler_export import hand_student

from collectors.evaluation.pair_check import choose, pair_check
from collectors.evaluation.priced_eval import fastest
from decoder.deploy.deployment import threshold_variants, variant_name
from decoder.deploy.scheduler import ManifestError
from models.offline import THRESHOLD_OFFSETS
from pipeline.deploy import preference_order


def test_a_shifted_student_invokes_exactly_above_its_shifted_threshold(tmp_path):
    path = hand_student(tmp_path / "s", threshold=0.75, skip_rest_below=1.5)  # invoke iff z0 > 6
    students = threshold_variants(path, 5, 10, (-1.5, 0.0, 1.5))
    assert list(students) == ["student:-1.50", "student", "student:1.50"]
    z0 = np.array([3.9, 4.1, 5.9, 6.1, 7.9, 8.1])
    z = np.zeros((len(z0), 17))
    z[:, 0] = z0
    got = {n: [s.decide(r) for r in z] for n, s in students.items()}
    assert got["student:-1.50"] == [False, True, True, True, True, True]  # z0 > 4
    assert got["student"] == [False, False, False, True, True, True]  # z0 > 6
    assert got["student:1.50"] == [False, False, False, False, False, True]  # z0 > 8
    # the gate stays g below each one's own threshold
    assert [s.skip_rest_below for s in students.values()] == pytest.approx([-2.25, -0.75, 0.75])
    # the margins themselves do not move
    assert {round(s.margin(z[3]), 9) for s in students.values()} == {round(0.75 * 6.1 - 3.75, 9)}


def test_shifted_students_are_validated_like_the_exported_one(tmp_path):
    path = hand_student(tmp_path / "s", threshold=0.0, skip_rest_below=1.0)
    with pytest.raises(ManifestError, match="the decoder runs D = 6"):
        threshold_variants(path, 6, 10, (0.0,))
    assert variant_name(0.0) == "student" and variant_name(-0.5) == "student:-0.50"
    # names go into MLflow metric keys: alphanumerics, '_', '-', '.', ' ', ':' and '/' only
    for o in (*THRESHOLD_OFFSETS, -1.25, 2.0):
        assert re.fullmatch(r"[\w\-. :/]+", f"pair_check.zoo-l.speedup.{variant_name(o)}"), o


OPTIONS = ("student", "student:-0.50", "student:0.50", "all-small", "all-mid")


def _noisy(base: float, factor: float, n: int = 12, spread: float = 0.3, seed: int = 0) -> list[float]:
    """n prompts' priced ms around ``base`` x ``factor``, each prompt its own size (as real prompts)."""
    rng = np.random.default_rng(seed)
    return list(base * factor * rng.uniform(1 - spread, 1 + spread, n))


def _calibration(**factors: float) -> list:
    """Two cells of 12 prompts: AR and every option priced on the same prompts, an option's ms the
    student's times its factor, prompt by prompt, with its own noise of 2% on top."""
    cells = []
    for c in range(2):
        sizes = _noisy(100.0, 1.0, seed=c)
        rng = np.random.default_rng(10 + c)
        ms = {o: [x * f * rng.uniform(0.98, 1.02) for x in sizes] for o, f in factors.items()}
        cells.append(_cell_of([2.0 * x for x in sizes], **ms))
    return cells


def test_the_pair_check_keeps_the_preferred_student_unless_another_option_wins_beyond_its_interval():
    """A 1% edge that the prompts do not agree on keeps the exported threshold; an endpoint 20%
    faster on every prompt is deployed, with its paired margin recorded."""
    near = _calibration(**{"student": 1.0, "student:-0.50": 0.99, "student:0.50": 1.05, "all-small": 1.3,
                           "all-mid": 1.1})  # fmt: skip
    check = pair_check(near, OPTIONS)
    point, low, high = check["paired"]["student:-0.50"]
    assert point > 1.0 and low < 1.0 < high  # faster on the whole, not beyond its interval
    assert check["deploys"] == check["preferred"] == "student" and check["margin"] == [1.0, 1.0, 1.0]
    assert check["prompts"] == 24 and check["speedup"]["student"] == pytest.approx(2.0, rel=0.02)
    clear = _calibration(**{"student": 1.0, "student:-0.50": 0.99, "student:0.50": 1.05, "all-small": 1.3,
                            "all-mid": 0.8})  # fmt: skip
    check = pair_check(clear, OPTIONS)
    assert check["deploys"] == "all-mid" and check["margin"][1] > 1.2
    assert check["margin"] == check["paired"]["all-mid"]


def test_among_several_winners_the_one_surest_to_win_is_chosen_and_equal_ones_go_to_the_earlier():
    both = _calibration(**{"student": 1.0, "student:-0.50": 0.85, "student:0.50": 0.9, "all-small": 1.3,
                           "all-mid": 0.86})  # fmt: skip
    chosen, paired = choose(both, OPTIONS)
    assert chosen == "student:-0.50" and paired["student:-0.50"][1] > paired["all-mid"][1]
    tie = _calibration(**{"student": 1.0, "a": 0.8, "b": 0.8})
    for c in tie:
        c.methods["b"] = c.methods["a"]
    assert choose(tie, ("student", "a", "b"))[0] == "a" and choose(tie, ("student", "b", "a"))[0] == "b"
    with pytest.raises(ValueError, match="no calibration cells"):
        pair_check([], OPTIONS)
    with pytest.raises(ValueError, match="no options"):
        pair_check(both, ())


def test_the_preference_order_and_the_fastest_method():
    order = preference_order({variant_name(o): None for o in THRESHOLD_OFFSETS})
    assert order[0] == "student" and order[1:3] == ("student:-0.50", "student:0.50")
    assert (
        fastest({"a": 1.0, "b": 1.0}, ["b", "a"]) == "b" and fastest({"a": 1.0, "b": 1.1}, ["a", "b"]) == "b"
    )
    with pytest.raises(ValueError, match="no methods"):
        fastest({}, [])
