"""The online adaptive rule (decoder/core/adaptive.py): its tiers, its replay, its command line."""

from __future__ import annotations

import pytest
from conftest import noisy_copy, repeated_prompts, tiny_model

from collectors.collect.policy_replay import replay_policy
from collectors.collect.records import round_stats
from collectors.collect.replay import Replayer
from decoder.core.adaptive import ALPHA, AdaptiveThresholds, AdaptiveTiers, parse_adaptive
from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext, StepContext, parse_policy, schedule_bits, uses_mid
from decoder.core.records import RoundStats
from decoder.deploy.latency import counts_from_round
from decoder.generate import generate
from decoder.models.pair import make_pair

RUNTIME = RuntimeContext(prompt_tokens=20, target_ms=10.0, mid_ms=2.0)


def _round(rule: AdaptiveTiers, accepted, runtime: RuntimeContext | None = RUNTIME) -> tuple[bool, ...]:
    """One round: the rule's answers at steps 1..5, then the round's outcome: ``accepted`` drafted
    tokens, or ``accepted(tier)`` of the tier it played."""
    bits = tuple(rule(StepContext(k, 5, (), None, runtime)) for k in range(1, 6))  # type: ignore[arg-type]
    got = accepted(sum(bits)) if callable(accepted) else accepted
    rule.round_done(RoundStats(got, got + 1, 0, 0, (), {}))
    return bits


def test_the_rule_probes_a_neighbour_and_climbs_to_the_tier_that_prices_faster() -> None:
    """Tier 0 first, tier 1 probed in round 1, tier 2 in round 2; where one mid call lifts acceptance
    from 1 to 4 at a 20% dearer round the rule climbs to tier 1 and stays (tier 2 adds cost, not
    tokens), and it falls back to tier 0 once the mid drafter stops paying."""
    rule = AdaptiveTiers(AdaptiveThresholds(margin=0.05, probe=3))
    paying = {0: 1, 1: 4, 2: 4, 3: 4}
    assert _round(rule, paying.get) == (False,) * 5
    assert _round(rule, paying.get) == (True, False, False, False, False)  # the probe of tier 1
    assert rule.tier == 1  # (1 + 4) / 12 ms > (1 + 1) / 10 ms x 1.05
    assert _round(rule, paying.get) == (True, True, False, False, False)  # tier 2 never ran: probed
    assert rule.tier == 1  # (1 + 4) / 14 ms < (1 + 4) / 12 ms
    played = [sum(_round(rule, paying.get)) for _ in range(8)]
    assert played.count(1) > max(played.count(0), played.count(2)) > 0  # neighbours probed now and then
    for _ in range(30):  # the mid stops paying: every tier above 0 accepts nothing
        _round(rule, lambda tier: 1 if tier == 0 else 0)
    assert rule.tier == 0


def test_a_margin_keeps_the_tier_on_a_near_tie() -> None:
    """A neighbour that prices less than `margin` faster does not move the tier."""
    costs = RuntimeContext(20, target_ms=10.0, mid_ms=0.0)  # equal costs: the rate is the acceptance
    wide, narrow = AdaptiveTiers(AdaptiveThresholds(0.5, 50)), AdaptiveTiers(AdaptiveThresholds(0.0, 50))
    for rule in (wide, narrow):
        _round(rule, 2, costs)
        _round(rule, 2.4, costs)  # type: ignore[arg-type]  # tier 1: (1 + 2.4) / (1 + 2) = 1.13x
    assert wide.tier == 0 and narrow.tier == 1
    assert narrow.rate(1) == pytest.approx(3.4 / 10.0)
    assert _round(narrow, 0, costs) == (True, True, False, False, False)  # tier 2 never ran: probed
    assert _round(narrow, 0, costs) == (True, False, False, False, False)  # back on tier 1
    assert narrow.rate(1) == pytest.approx((1 + ALPHA * 0 + (1 - ALPHA) * 2.4) / 10.0)


def test_policy_strings_and_bad_thresholds() -> None:
    assert parse_policy("adaptive", 5) == "adaptive" and uses_mid("adaptive")
    assert parse_adaptive("adaptive") == AdaptiveThresholds()
    assert parse_adaptive("adaptive:0.1:4") == AdaptiveThresholds(0.1, 4)
    bad_input = {"adaptive:x:4": "MARGIN must be a number", "adaptive:0.1": "expected 'adaptive'",
                 "adaptive:-1:4": "margin must be", "adaptive:0.1:0": "probe must be"}  # fmt: skip
    for bad, message in bad_input.items():
        with pytest.raises(ValueError, match=message):
            parse_adaptive(bad)


def test_the_replay_of_the_rule_is_real_decoding_round_for_round() -> None:
    """The rule decided from replayed rounds (policy_replay hands it each round) decodes as in
    generate: the same tiers, rounds and counts; the replayed RoundStats price as the records do."""
    target = tiny_model("qwen3", seed=71)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=72), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=32)
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], 0, batch_rows=64)
    tiers = set()
    for prompt in repeated_prompts(3, 73, base=(4, 12), cut=(10, 40)):
        live, replayed = AdaptiveTiers(AdaptiveThresholds(0.0, 2)), AdaptiveTiers(AdaptiveThresholds(0.0, 2))
        res = generate(pair, prompt, live, config, runtime=RUNTIME)
        traj = replay_policy(replayer, replayer.inputs(prompt), replayed, RUNTIME)
        assert [r.mid_calls for r in res.rounds] == traj.bits
        assert [r.accepted for r in res.rounds] == [r.accepted for r in traj.rounds]
        for rec, bits in zip(traj.rounds, traj.bits, strict=True):
            assert counts_from_round(round_stats(rec, bits)) == rec.counts()
        tiers |= {sum(b) for b in traj.bits}
    assert len(tiers) > 1, "the rule never changed tier: the test would not tell replays apart"


def test_adaptive_decodes_losslessly(tmp_path) -> None:
    """'adaptive' through generate with no runtime context: the target's own tokens."""
    target = tiny_model("llama", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    prompt = repeated_prompts(1, 83, base=(4, 12), cut=(10, 40))[0]
    config = DecodeConfig(max_new_tokens=24)
    ar = generate(pair, prompt, "ar", config)
    res = generate(pair, prompt, "adaptive:0.05:2", config)
    assert res.new_tokens == ar.new_tokens and any(any(r.mid_calls) for r in res.rounds)
