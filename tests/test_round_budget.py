"""The per-round verification budget: its rule, its exact replay, and losslessness.

A round verifies B_t = argmax over B <= budget of (1 + E[A](B)) / (fixed + verify_ms[B]), E[A](B) the
sum of the first B nodes' path probabilities. On a cost curve where any tree costs two target steps
(fp32 on a CPU), a round with unlikely drafts verifies the root alone, a plain target step.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import noisy_copy, repeated_prompts, tiny_model
from hypothesis import given, settings
from test_budget import trees_and_targets

from collectors.collect.replay import Replayer
from collectors.pricing.budget_sweep import RoundRule, sweep_pair
from decoder.core.budget import expected_gains, round_budget, verify_budget
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.decode import autoregressive
from decoder.core.policies import schedule_bits
from decoder.core.tree import DraftTree
from decoder.deploy.latency import LatencyProfile
from decoder.generate import generate
from decoder.models.pair import make_pair

# any tree costs two target steps: a CPU's GEMV-to-GEMM step in fp32 (ENVIRONMENT.md)
STEP_COSTS = (1.0, *([2.0] * 63))


@settings(max_examples=200, deadline=None)
@given(trees_and_targets(positive_edges=False))
def test_gains_are_the_path_probabilities_of_what_prune_keeps(case):
    tree, _ = case
    b_max = tree.n_alive + 2
    gains = expected_gains(tree, b_max)
    for b in range(b_max + 1):
        kept = tree.prune(b).source[1:]
        assert gains[b] == pytest.approx(sum(math.exp(tree.scores[v]) for v in kept), abs=1e-9), b


def test_a_tree_that_costs_two_steps_is_verified_only_when_it_likely_pays():
    unsure = [0.0, 0.4, 0.6, 0.7]  # at most 1.7 tokens for the price of 2 steps: one step instead
    sure = [0.0, 0.9, 1.7, 2.4]  # 3.4 tokens for the price of 2
    assert round_budget(unsure, STEP_COSTS, 0.0) == 0
    assert round_budget(sure, STEP_COSTS, 0.0) == 3
    # a flat curve: every node that may be accepted is worth verifying
    assert round_budget(unsure, [1.0, 1.01, 1.02, 1.03], 0.0) == 3
    # drafting already paid for raises what a round costs, so a tree pays sooner
    assert round_budget([0.0, 0.4, 0.9, 1.1], STEP_COSTS, 0.0) == 3
    assert round_budget([0.0, 0.4, 0.6, 0.7], STEP_COSTS, 10.0) == 3
    with pytest.raises(ValueError, match="need 4 verify costs"):
        round_budget(sure, [1.0, 2.0], 0.0)


def test_verify_budget_is_the_fixed_budget_until_costs_are_given():
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 1, math.log(0.3))
    tree.add_child(a, 2, math.log(0.5))
    assert verify_budget(tree, TreeConfig(budget=4)) == 4
    gated = TreeConfig(budget=4, verify_ms=STEP_COSTS[:5])
    assert verify_budget(tree, gated) == 0  # 0.3 + 0.15 expected tokens: not worth a second step
    assert verify_budget(tree, replace(gated, round_gain_scale=4.0)) == 2  # 1.8 expected: it is
    with pytest.raises(ValueError, match=r"verify_ms needs one cost per budget 0..4"):
        TreeConfig(budget=4, verify_ms=(1.0, 2.0))
    with pytest.raises(ValueError, match="verify_ms must be finite and > 0"):
        TreeConfig(budget=1, verify_ms=(1.0, float("nan")))
    with pytest.raises(ValueError, match="round_gain_scale must be finite and >= 0"):
        TreeConfig(budget=1, verify_ms=(1.0, 2.0), round_gain_scale=-1.0)


def step_profile() -> LatencyProfile:
    """A pair's costs where any tree costs two target steps (ms)."""
    return LatencyProfile(
        pair="tiny", device="cpu", device_name="test", torch_threads=1, clock="thread_cpu",
        torch_version="0", dtype="float32", context_len=32, warmup=0, repeats=1, samples_per_repeat=1,
        verify_points=((1, 1.0), (2, 2.0), (64, 2.0)), mid_tokens=(1, 64), mid_fed=(0,),
        mid_grid_ms=((0.3, 0.6),), mid_end_ms=0.01, ngram_step_ms=0.01, ngram_node_ms=0.001,
        ngram_mean_frontier=4.0, decision_ms=0.0, ar_token_ms=1.0, tree_points=((1, 0.01),),
    )  # fmt: skip


def _pair(seed: int):
    target = tiny_model("qwen3", seed=seed)
    return make_pair(target, noisy_copy(target, 0.5, seed=seed + 1), eos_token_ids=(0,))


def test_decoding_with_the_rule_is_lossless_and_replays_round_for_round():
    pair = _pair(81)
    # the tiny random target is greedy on flat rows: its drafts are accepted far above their
    # probability, so the gains are scaled up (the budget stage fits this scale from replay)
    tree = TreeConfig(budget=8, verify_ms=STEP_COSTS[:9], round_fixed_ms=0.2, round_gain_scale=20.0)
    config = DecodeConfig(max_new_tokens=24, tree=tree)
    schedules = [schedule_bits(0, 5), schedule_bits(21, 5)]  # 00000 and 10101
    replayer = Replayer(pair, config, schedules, round_table_stride=0)
    sizes = set()
    for prompt in repeated_prompts(3, seed=82, base=(4, 12), cut=(10, 40)):
        ar = autoregressive(pair, prompt, config).new_tokens
        rep = replayer.replay_prompt(prompt)
        for s, bits in enumerate(schedules):
            res = generate(pair, prompt, "".join("1" if b else "0" for b in bits), config)
            assert res.new_tokens == ar
            assert [(r.accepted, r.verified_size + 1) for r in res.rounds] == [
                (r.accepted, r.verified_nodes) for r in rep.rounds[s]
            ]
            sizes |= {r.verified_size for r in res.rounds}
    assert 0 in sizes and max(sizes) > 0, sizes  # both kinds of round happened: the test can tell


def test_the_sweep_prices_the_rule_as_plain_replay_does():
    """The budget stage prices a rule by walking the sweep's outcomes at every start; that walk is
    the replay of decoding with the rule's TreeConfig, round for round."""
    pair = _pair(83)
    prompts = repeated_prompts(2, seed=84, base=(4, 12), cut=(10, 40))
    tree = TreeConfig(budget=8)
    profile = step_profile()
    sweeps = sweep_pair(pair, profile, prompts, tree, 20)
    rule = RoundRule(6, STEP_COSTS[:7], 0.1, 20.0)
    gated = replace(tree, budget=6, verify_ms=rule.verify_ms, round_fixed_ms=0.1, round_gain_scale=20.0)
    sizes = set()
    for name, sw in sweeps.items():
        walks = sw.round_rule_walks(rule)
        rep = Replayer(pair, DecodeConfig(max_new_tokens=20, tree=gated), [sw.bits], round_table_stride=0)
        for prompt, walk in zip(prompts, walks, strict=True):
            plain = rep.replay_prompt(prompt).rounds[0]
            expected = [replace(r.counts(), decisions=0) for r in plain]
            assert [r.counts() for r in walk.rounds] == expected, name
            sizes |= {r.verified_nodes for r in walk.rounds}
    assert 1 in sizes and max(sizes) > 1, sizes  # root-only rounds and tree rounds both walked
