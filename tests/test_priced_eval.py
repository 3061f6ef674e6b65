"""Priced evaluation by replay equals pricing the counts of real decoding, prompt by prompt."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import noisy_copy, tiny_model
from test_latency import linear_profile
from test_policy_replay import _prompts

from collectors.collect.execute import execute_prompt
from collectors.evaluation.priced_eval import (
    PricedCell,
    PricedMethod,
    bootstrap_speedup,
    priced_cell,
)
from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext
from decoder.deploy.latency import price_ar, price_round
from decoder.models.pair import make_pair


@pytest.fixture(scope="module")
def cell():
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=20)
    prompts = _prompts(4, seed=83)
    profile = linear_profile()
    runtime = RuntimeContext(prompt_tokens=20, target_ms=2.0, mid_ms=1.0)
    fixed = {"all-small": "00000", "all-mid": "11111", "10101": "10101"}
    policies = {"odd-steps": lambda ctx: ctx.step % 2 == 1}
    result = priced_cell(pair, prompts, config, profile, runtime, policies, fixed)
    return pair, config, prompts, profile, result


def test_fixed_schedules_are_priced_like_real_decoding(cell) -> None:
    pair, config, prompts, profile, result = cell
    for name, text in (("all-small", "00000"), ("all-mid", "11111"), ("10101", "10101")):
        bits = tuple(c == "1" for c in text)
        for i, prompt in enumerate(prompts):
            rounds, n = execute_prompt(pair, prompt, bits, config)
            real = sum(price_round(profile, replace(r.counts(), decisions=0)) for r in rounds)
            assert result.methods[name].ms[i] == pytest.approx(real, rel=1e-9), (name, i)
            assert result.methods[name].tokens[i] == n == result.tokens[i]
    assert result.ar_ms == pytest.approx([price_ar(profile, int(n)) for n in result.tokens])


def test_a_policy_pays_for_its_decisions_and_best_fixed_is_the_best(cell) -> None:
    *_, result = cell
    policy, fixed = result.methods["odd-steps"], result.methods["10101"]
    assert policy.mid_calls_per_step == pytest.approx((1, 0, 1, 0, 1)) == fixed.mid_calls_per_step
    assert policy.accepted == pytest.approx(fixed.accepted)
    assert (policy.ms > fixed.ms).all()  # same rounds, plus D scheduler decisions each
    best = result.methods["best-fixed"]
    tps = {n: m.tokens.sum() / m.ms.sum() for n, m in result.methods.items()}
    assert all(tps["best-fixed"] >= tps[n] - 1e-12 for n in ("all-small", "all-mid", "10101"))
    assert best.schedule == result.best_fixed and len(best.schedule) == 5


def test_without_hindsight_only_the_named_schedules_are_replayed_with_the_same_prices(cell) -> None:
    pair, config, prompts, profile, full = cell
    runtime = RuntimeContext(prompt_tokens=20, target_ms=2.0, mid_ms=1.0)
    fixed = {"all-small": "00000", "all-mid": "11111"}
    policies = {"odd-steps": lambda ctx: ctx.step % 2 == 1}
    part = priced_cell(pair, prompts, config, profile, runtime, policies, fixed, hindsight=False)
    assert set(part.methods) == {"all-small", "all-mid", "odd-steps"} and part.best_fixed == ""
    for name in part.methods:
        assert part.methods[name].ms.tolist() == full.methods[name].ms.tolist(), name
        assert part.methods[name].accepted == full.methods[name].accepted
    with pytest.raises(ValueError, match="a string of 5 bits"):
        priced_cell(pair, prompts, config, profile, runtime, {}, {"short": "001"}, hindsight=False)
    with pytest.raises(ValueError, match="'baseline': 'ar' is not a fixed schedule"):
        priced_cell(pair, prompts, config, profile, runtime, {}, {"baseline": "ar"})
    named = priced_cell(pair, prompts, config, profile, runtime, {}, {"skip": "all-small"}, hindsight=False)
    assert named.methods["skip"].ms.tolist() == full.methods["all-small"].ms.tolist()


def test_bootstrap_interval_brackets_the_ratio_of_sums() -> None:
    rng = np.random.default_rng(0)
    ar = rng.uniform(50, 100, size=30)
    ms = ar / rng.uniform(1.2, 1.6, size=30)
    point, low, high = bootstrap_speedup(ar, ms)
    assert point == pytest.approx(ar.sum() / ms.sum())
    assert 1.2 < low < point < high < 1.6
    same = bootstrap_speedup(ar, ar / 1.4)
    assert same == pytest.approx((1.4, 1.4, 1.4))  # no spread, no interval
    assert bootstrap_speedup(ar[:1], ms[:1]) == (ar[0] / ms[0],) * 3  # one prompt: nothing to resample


def test_bootstrap_resamples_prompts_with_their_ar_and_method_times_together() -> None:
    rng = np.random.default_rng(1)
    ar = rng.uniform(20, 400, size=12)  # prompts of very different lengths: pairing matters
    ms = ar / rng.uniform(1.1, 2.0, size=12)
    n_boot, seed = 500, 7
    # the definition: resample prompt indices, take the ratio of sums, read the 2.5 and 97.5 percentiles
    idx = np.random.default_rng(seed).integers(0, len(ms), size=(n_boot, len(ms)))
    boot = ar[idx].sum(axis=1) / ms[idx].sum(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    assert bootstrap_speedup(ar, ms, n_boot, seed) == pytest.approx(
        (ar.sum() / ms.sum(), low, high), rel=1e-12
    )
    assert bootstrap_speedup(ar, ms, n_boot, seed) == bootstrap_speedup(ar, ms, n_boot, seed)
    assert bootstrap_speedup(ar, ms, n_boot, seed + 1) != bootstrap_speedup(ar, ms, n_boot, seed)


def _cell_of(ar_ms: list[float], **ms: list[float]) -> PricedCell:
    """A PricedCell with the given per-prompt priced ms per method (tokens do not enter the check)."""
    n = len(ar_ms)
    methods = {
        name: PricedMethod(name, "", np.asarray(v, dtype=float), np.ones(n), 1.0, ())
        for name, v in ms.items()
    }
    return PricedCell(np.asarray(ar_ms, dtype=float), np.ones(n), methods, "00000")
