"""The pricing check: priced and measured round latency of real decoding, per policy.

Timings are not compared with each other (noisy machines); what is checked is that each row
prices exactly the rounds that were decoded, with the decision rule of its policy kind.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import noisy_copy, tiny_model

from collectors.collect.execute import execute_prompt
from collectors.pricing.pricing_check import (
    PricingRow,
    check_components,
    check_pricing,
    format_components,
    format_pricing,
)
from collectors.pricing.profile_rounds import reference_context
from collectors.pricing.profiling import measure_profile
from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext, StepContext
from decoder.core.timing import COMPONENTS
from decoder.deploy.latency import counts_from_round, price_round, round_parts
from decoder.generate import generate
from decoder.models.pair import make_pair


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("qwen3", seed=31)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=32), eos_token_ids=())
    profile = measure_profile(
        pair,
        "tiny",
        context_len=24,
        sizes=(1, 8, 64),
        warmup=0,
        repeats=1,
        mid_tokens=(1, 16),
        mid_fed=(0, 32),
    )
    stream = reference_context(pair, 90)
    return pair, profile, [stream[:30], stream[30:60]]


def mid_at_even_steps(ctx: StepContext) -> bool:
    return ctx.step % 2 == 0


def test_rows_price_exactly_the_decoded_rounds(setup) -> None:
    pair, profile, prompts = setup
    config = DecodeConfig(max_new_tokens=10)
    runtime = RuntimeContext(30, 2.0, 1.0)
    rows = check_pricing(
        pair,
        profile,
        prompts,
        {"small": "all-small", "10101": "10101", "even": mid_at_even_steps},
        config,
        runtime,
    )
    assert [r.policy for r in rows] == ["small", "10101", "even"]
    by = {r.policy: r for r in rows}
    # A fixed schedule: execute mode's rounds, priced without decisions.
    recs = [
        rec for p in prompts for rec in execute_prompt(pair, p, (True, False, True, False, True), config)[0]
    ]
    assert by["10101"].n_rounds == len(recs)
    want = sum(price_round(profile, replace(r.counts(), decisions=0)) for r in recs)
    assert by["10101"].priced_ms == pytest.approx(want)
    assert by["10101"].n_tokens == 2 * (10 - 1)  # the rounds' tokens: the prefill yields the first
    # A callable: generate's rounds, one decision per step.
    rounds = [r for p in prompts for r in generate(pair, p, mid_at_even_steps, config, runtime).rounds]
    assert by["even"].n_rounds == len(rounds)
    with_decisions = sum(price_round(profile, counts_from_round(r)) for r in rounds)
    assert all(counts_from_round(r).decisions == 5 for r in rounds)
    assert by["even"].priced_ms == pytest.approx(with_decisions)
    for r in rows:
        assert r.measured_ms > 0 and math.isfinite(r.ratio)
        assert r.round_ratio_p10 <= r.round_ratio_median <= r.round_ratio_p90
        assert 0 < r.cpu_share <= 1.05  # one torch thread: CPU time cannot outrun the wall clock
    table = format_pricing("tiny", rows)
    assert table.count("\n") == 1 + len(rows) and "priced/meas" in table


def test_ratio_and_bad_input(setup) -> None:
    pair, profile, prompts = setup
    row = PricingRow(
        "x",
        3,
        10,
        priced_ms=9.0,
        measured_ms=10.0,
        round_ratio_median=0.9,
        round_ratio_p10=0.8,
        round_ratio_p90=1.0,
        cpu_share=0.5,
    )
    assert row.ratio == pytest.approx(0.9) and row.cpu_ratio == pytest.approx(1.8)
    with pytest.raises(ValueError, match="at least one prompt"):
        check_pricing(pair, profile, [], {"a": "all-small"}, DecodeConfig(max_new_tokens=4))
    with pytest.raises(ValueError):
        check_pricing(pair, profile, prompts, {"bad": "1x1"}, DecodeConfig(max_new_tokens=4))


def test_round_parts_follow_the_decoders_round_clock(setup) -> None:
    """round_parts splits a decoded round by the decoder's own clock keys, and its mid part is zero
    exactly in rounds without a mid call, with and without the cold-cache terms."""
    pair, profile, prompts = setup
    config = DecodeConfig(max_new_tokens=10)
    runtime = RuntimeContext(30, 2.0, 1.0)
    rounds = [r for p in prompts for r in generate(pair, p, mid_at_even_steps, config, runtime).rounds]
    rounds += [r for p in prompts for r in generate(pair, p, "all-small", config, runtime).rounds]
    assert any(counts_from_round(r).mid_call_tokens for r in rounds)
    assert any(not counts_from_round(r).mid_call_tokens for r in rounds)
    cold = replace(profile, verify_cold_points=((1, 0.1), (64, 0.3)), mid_cold_ms=0.2, decision_cold_ms=0.1)
    for r in rounds:
        counts = counts_from_round(r)
        for prof in (profile, cold):
            parts = round_parts(prof, counts)
            assert set(parts) == set(COMPONENTS) == set(r.times)
            assert parts["mid"] > 0 if counts.mid_call_tokens else parts["mid"] == 0


def test_components_split_the_decoded_rounds(setup) -> None:
    pair, profile, prompts = setup
    config = DecodeConfig(max_new_tokens=10)
    runtime = RuntimeContext(30, 2.0, 1.0)
    rows = check_components(
        pair, profile, prompts, {"10101": "10101", "even": mid_at_even_steps}, config, runtime
    )
    assert [r.policy for r in rows] == ["ar", "10101", "even"]
    ar, fixed, even = rows
    assert ar.n_rounds == 2 * (10 - 1)  # AR steps after the prefill's token
    assert ar.priced_ms == {"ar": pytest.approx(18 * profile.ar_token_ms)} and ar.measured_ms["ar"] > 0
    rounds = [r for p in prompts for r in generate(pair, p, mid_at_even_steps, config, runtime).rounds]
    assert even.n_rounds == len(rounds)
    assert sum(even.priced_ms.values()) == pytest.approx(
        sum(price_round(profile, counts_from_round(r)) for r in rounds)
    )
    per_round = 5 * profile.decision_ms + profile.decision_cold_ms  # the first decision's extra once
    assert even.priced_ms["scheduler"] == pytest.approx(len(rounds) * per_round)
    assert fixed.priced_ms["scheduler"] == 0.0  # a fixed schedule decides nothing at run time
    assert fixed.priced_ms["mid"] > 0 and fixed.measured_ms["verify"] > 0
    table = format_components("tiny", rows)
    assert table.count("\n") == 1 + 1 + 2 * (len(COMPONENTS) + 1)
    with pytest.raises(ValueError, match="at least one prompt"):
        check_components(pair, profile, [], {"a": "all-small"}, config)
