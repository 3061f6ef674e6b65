"""The pair check's per-pair thresholds: the exported student at shifted thresholds decides where
its shifted threshold says (gate included), is validated like the exported one, and the check
deploys the fastest shifted student only where it beats the better endpoint."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from test_priced_eval import _cell_of
from test_scheduler_export import hand_student

from collectors.evaluation.deployed import deployed_variants
from collectors.evaluation.priced_eval import NEAR_TIE, fastest, pair_check
from decoder.deploy.deployment import threshold_variants, variant_name
from decoder.deploy.scheduler import ManifestError
from models.offline import THRESHOLD_OFFSETS
from pipeline.deploy import preference_order
from pipeline.evaluate import threshold_transfer


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


def test_the_pair_check_deploys_the_fastest_threshold_only_where_it_beats_the_better_endpoint():
    ends = {"all-small": [100.0, 100.0], "all-mid": [80.0, 80.0]}  # All-Mid the better endpoint
    cell = _cell_of([200.0, 200.0], student=[85.0, 85.0], **{"student:-0.50": [70.0, 75.0]}, **ends)
    check = pair_check([cell], ("student:-0.50", "student"))
    assert check["deploys"] == "student:-0.50"
    assert check["speedup"]["student:-0.50"] == pytest.approx(400.0 / 145.0)
    # the exported threshold alone loses to All-Mid: the endpoint
    assert pair_check([cell], ("student",))["deploys"] == "all-mid"
    # two thresholds tie: the first listed
    tie = _cell_of([200.0], student=[70.0], **{"student:0.50": [70.0]}, **{k: v[:1] for k, v in ends.items()})
    assert pair_check([tie], ("student:0.50", "student"))["deploys"] == "student:0.50"
    assert pair_check([tie], ("student", "student:0.50"))["deploys"] == "student"
    with pytest.raises(ValueError, match="no learned policy"):
        pair_check([cell], ())


def test_a_near_tie_keeps_the_exported_threshold_and_a_clear_win_does_not():
    ends = {"all-small": [100.0], "all-mid": [100.0]}
    near = _cell_of([200.0], student=[70.0], **{"student:1.00": [69.5]}, **ends)  # 0.7% faster
    clear = _cell_of([200.0], student=[70.0], **{"student:1.00": [68.0]}, **ends)  # 2.9% faster
    order = preference_order({variant_name(o): None for o in THRESHOLD_OFFSETS})
    assert order[0] == "student" and order[1:3] == ("student:-0.50", "student:0.50")
    assert pair_check([near], ("student", "student:1.00"))["deploys"] == "student:1.00"  # no tolerance
    assert pair_check([near], ("student", "student:1.00"), NEAR_TIE)["deploys"] == "student"
    assert pair_check([clear], ("student", "student:1.00"), NEAR_TIE)["deploys"] == "student:1.00"
    assert fastest({"a": 1.0, "b": 1.0}, ["b", "a"], NEAR_TIE) == "b"
    with pytest.raises(ValueError, match="tolerance"):
        fastest({"a": 1.0}, ["a"], 1.0)


def test_only_pairs_deploying_a_shifted_threshold_decode_it_as_deployed(tmp_path):
    students = threshold_variants(
        hand_student(tmp_path / "s", threshold=0.0, skip_rest_below=1.0), 5, 10, (-0.5, 0.0, 0.5)
    )

    def bundle(deploys: str) -> SimpleNamespace:
        policy = students.get(deploys, deploys)
        return SimpleNamespace(policy=policy, is_learned=deploys in students, decision={"deploys": deploys})

    deployments = {"a": bundle("student:-0.50"), "b": bundle("student"), "c": bundle("all-small")}
    shifted = deployed_variants(deployments)
    assert list(shifted) == ["a"] and shifted["a"]["deployed"] is students["student:-0.50"]


def test_the_held_back_check_pools_the_fitting_cells_only():
    """Pooled over a and b the shifted threshold is fastest (400/150 vs 400/160); the held-out task
    c, where the exported one wins by far, would flip it if it were counted."""
    ends = {"all-small": [100.0], "all-mid": [100.0]}
    cells = {
        ("p", "a"): _cell_of([100.0], student=[40.0], **{"student:-0.50": [60.0]}, **ends),
        ("p", "b"): _cell_of([300.0], student=[120.0], **{"student:-0.50": [90.0]}, **ends),
        ("p", "c"): _cell_of([900.0], student=[100.0], **{"student:-0.50": [900.0]}, **ends),
    }
    checks = {
        "p": {
            "deploys": "student",
            "speedup": dict.fromkeys(("all-small", "all-mid", "student", "student:-0.50"), 1.0),
        }
    }
    got = threshold_transfer(cells, checks, ["a", "b"])["p"]
    assert got["chosen"] == "student" and got["held_back_best"] == "student:-0.50"
    assert got["speedup"]["student"] == pytest.approx(400.0 / 160.0)
    assert got["speedup"]["student:-0.50"] == pytest.approx(400.0 / 150.0)
    assert got["speedup"]["all-small"] == pytest.approx(2.0)  # endpoints shown, never the best threshold
    assert threshold_transfer(cells, checks, ["a", "b", "c"])["p"]["held_back_best"] == "student"
