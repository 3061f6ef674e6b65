"""wall_check's pair profiled again beside its decodes: the profile stage's measurement, so the two
profiles compare point by point and the pricing check can set one against the other."""

from __future__ import annotations

import math

import pytest
from conftest import noisy_copy, tiny_model
from test_latency import linear_profile

from collectors.collect.plan import tree_config
from collectors.evaluation.wall_decode import profile_beside, profile_drift
from collectors.pricing.profile_passes import COMPONENTS, compare_profiles
from config.params import load_params
from decoder.deploy.latency import load_profile
from decoder.models.pair import make_pair
from pipeline.profile import run_profile

SETTINGS = {"context_len": 16, "passes": 1, "warmup": 0, "repeats": 1, "samples_per_repeat": 1,
            "sizes": [1, 3, 8], "mid_tokens": [1, 4], "mid_fed": [0, 2]}  # fmt: skip


def test_the_beside_profile_measures_every_point_the_stage_profile_has(tmp_path):
    target = tiny_model("qwen3", seed=31)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=32), eos_token_ids=())
    params = load_params(overrides={"profile": {**SETTINGS, "pairs": ["tiny"], "out_dir": str(tmp_path)}})
    (path,) = run_profile(params.profile, lambda _: pair, tree_config(params.tree))
    stage = load_profile(path)
    beside = profile_beside(params, pair, "tiny")
    assert (beside.pair, beside.context_len, beside.mid_tokens, beside.mid_fed) == (
        stage.pair, stage.context_len, stage.mid_tokens, stage.mid_fed
    )  # fmt: skip
    assert [n for n, _ in beside.verify_points] == [n for n, _ in stage.verify_points]
    full = {a.component: a.n_points for a in compare_profiles(stage, stage)}
    assert {a.component: a.n_points for a in compare_profiles(stage, beside)} == full
    drift = profile_drift(stage, beside)
    assert set(drift) == set(full) and all(math.isfinite(r) and r > 0 for r in drift.values())


def test_drift_is_the_ratio_of_the_remeasured_profile_per_component():
    """A machine that runs every part twice as slow drifts 2.0 on every component; one whose mid
    drafter alone got 3x dearer drifts 3.0 there and 1.0 elsewhere."""
    base = linear_profile()
    slower = profile_drift(base, linear_profile(2.0))
    assert slower == {c: pytest.approx(2.0) for c in profile_drift(base, base)}
    grid = tuple(tuple(3 * ms for ms in row) for row in base.mid_grid_ms)
    drift = profile_drift(base, linear_profile(mid_grid_ms=grid))
    assert drift.pop("mid") == pytest.approx(3.0) and drift == {c: pytest.approx(1.0) for c in drift}
    assert set(profile_drift(base, base)) <= set(COMPONENTS)
