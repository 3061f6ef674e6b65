"""Per-request switch-off (decoder/deploy/switch_off.py): speculation goes off while it costs more than AR
in priced terms, probes come back at an exponential, capped backoff, and the report counts it."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.records import OFF, TREE, RoundModes, RoundStats
from decoder.deploy.latency import LatencyProfile
from decoder.deploy.round_prices import ProfilePricer
from decoder.deploy.switch_off import SwitchOff, SwitchOffRule
from decoder.generate import generate
from decoder.models.pair import make_pair

DEPTH = 3
TREE_CFG = TreeConfig(depth=DEPTH, width=2, topk=2, budget=8)
N_NEW = 160
DRAFTED = range(0, 8)  # the never-matching drafter's tokens, which the target never emits


def profile() -> LatencyProfile:
    """Hand-made costs (ms) of a pair whose mid drafter is cheap: AR 3, verify 2.6 + 0.4 n, a mid
    call 0.3 + 0.05 n, a small step 0.1, tree work 0.2."""
    cols, rows = (1, 8, 64), (0, 16, 64)
    return LatencyProfile(
        pair="hand", device="cpu", device_name="test", torch_threads=1, clock="wall", torch_version="0",
        dtype="float32", context_len=256, warmup=1, repeats=3, samples_per_repeat=1,
        verify_points=tuple((n, 2.6 + 0.4 * n) for n in (1, 2, 8, 64)),
        mid_tokens=cols, mid_fed=rows,
        mid_grid_ms=tuple(tuple(0.3 + 0.05 * n for n in cols) for _ in rows), mid_end_ms=0.05,
        ngram_step_ms=0.1, ngram_node_ms=0.0, ngram_mean_frontier=2.0, decision_ms=0.01,
        ar_token_ms=3.0, tree_points=((1, 0.2), (64, 0.2)), prompt_block_ms=0.1,
    )  # fmt: skip


def never_matching_pair():
    """Target: never emits DRAFTED (its head rows for them are 0, the rest's maximum is positive).
    Mid: a constant head that always proposes DRAFTED first, whatever the context."""
    target = tiny_model("llama", seed=51)
    mid = copy.deepcopy(target)
    with torch.no_grad():
        target.lm_head.weight[list(DRAFTED)] = 0.0
        head = torch.nn.Linear(mid.config.hidden_size, mid.config.vocab_size, bias=True)
        head.weight.zero_()
        head.bias.fill_(-5.0)
        head.bias[list(DRAFTED)] = torch.linspace(5.0, 4.0, len(DRAFTED))
    mid.lm_head = head
    return make_pair(target, mid.eval(), eos_token_ids=())


def always_matching_pair():
    target = tiny_model("llama", seed=52)
    return make_pair(target, copy.deepcopy(target), eos_token_ids=())


PROMPT = [random.Random(53).randrange(8, 96) for _ in range(12)]


def decode(pair, policy):
    return generate(pair, PROMPT, policy, DecodeConfig(max_new_tokens=N_NEW, tree=TREE_CFG))


def priced_ratio(pricer: ProfilePricer, res) -> float:
    return sum(pricer.round_ms(r) for r in res.rounds) / (res.decoded_tokens * pricer.ar_ms)


def test_a_drafter_that_never_matches_costs_at_most_a_few_percent_over_ar():
    pair = never_matching_pair()
    pricer = ProfilePricer.for_policy(profile(), "all-mid")
    ar = decode(pair, "ar")
    plain = decode(pair, "all-mid")
    wrapped = SwitchOff("all-mid", pricer, depth=DEPTH)
    res = decode(pair, wrapped)
    assert plain.new_tokens == res.new_tokens == ar.new_tokens
    assert all(r.accepted == 0 for r in plain.rounds)  # the stand-in really never matches
    assert priced_ratio(pricer, plain) > 2.0  # what speculating every round would cost
    report = wrapped.report()
    assert report.priced_ratio == pytest.approx(priced_ratio(pricer, res))
    assert report.priced_ratio <= 1.05
    assert report.switch_offs >= 2 and report.probes >= 1 and report.rounds_off > 0.8 * len(res.rounds)
    modes = RoundModes.of(res.rounds)
    assert (modes.speculated, modes.switched_off) == (report.rounds_speculated, report.rounds_off)
    assert modes.switch_offs == report.switch_offs and res.modes == modes
    assert report.rounds_speculated + report.rounds_off == len(res.rounds)


def test_a_drafter_that_always_matches_is_never_switched_off():
    pair = always_matching_pair()
    pricer = ProfilePricer.for_policy(profile(), "all-mid")
    wrapped = SwitchOff("all-mid", pricer, depth=DEPTH)
    res = decode(pair, wrapped)
    assert res.new_tokens == decode(pair, "ar").new_tokens
    report = wrapped.report()
    assert (report.switch_offs, report.rounds_off, report.probes) == (0, 0, 0)
    assert all(r.mode == TREE for r in res.rounds) and report.rounds_speculated == len(res.rounds)
    assert res.mean_accepted_length > DEPTH - 0.5
    assert report.priced_ratio < 0.8  # speculation pays: it stays on


def test_the_wrapper_speaks_for_its_policy_and_rejects_bad_input():
    pricer = ProfilePricer.for_policy(profile(), "all-small")
    small = SwitchOff("all-small", pricer, depth=DEPTH)
    pair = make_pair(tiny_model("qwen3", seed=54), None, eos_token_ids=())  # no mid: all-small runs
    assert generate(pair, PROMPT, small, DecodeConfig(max_new_tokens=12, tree=TREE_CFG)).new_tokens
    with pytest.raises(ValueError, match="calls the mid drafter"):
        generate(pair, PROMPT, SwitchOff("all-mid", pricer, depth=DEPTH), DecodeConfig(max_new_tokens=4))
    for bad in ("ar", "ddtree"):
        with pytest.raises(ValueError, match="TreeGraft schedule"):
            SwitchOff(bad, pricer, depth=DEPTH)
    with pytest.raises(ValueError, match="depth"):
        SwitchOff("all-small", pricer)
    with pytest.raises(ValueError, match="backoff_max"):
        SwitchOffRule(backoff=8, backoff_max=4)
    with pytest.raises(ValueError, match="patience"):
        SwitchOffRule(patience=0)


class CostPricer:
    """A stand-in pricer: AR 1 ms a token; a speculated round costs what its verified_size says."""

    ar_ms = 1.0

    def round_ms(self, stats: RoundStats) -> float:
        return float(stats.emitted) if stats.mode == OFF else float(stats.verified_size)


def run_rounds(wrapper: SwitchOff, rounds: list[tuple[int, int]]) -> list[bool]:
    """Drive the wrapper as the loop does: (cost ms, tokens) per speculated round; OFF rounds emit 1."""
    wrapper.reset()
    speculated, todo = [], list(rounds)
    while todo:
        on = wrapper.speculate_round()
        cost, tokens = todo.pop(0) if on else (1, 1)
        stats = RoundStats(0, tokens, cost, cost, (), {}, mode=TREE if on else OFF)
        wrapper.round_done(stats)
        speculated.append(on)
    return speculated


def test_probes_come_back_at_an_exponential_capped_backoff():
    rule = SwitchOffRule(patience=2, backoff=2, backoff_max=8, overhead=10.0)  # the allowance never binds
    wrapper = SwitchOff("all-small", CostPricer(), rule, depth=DEPTH)
    on = run_rounds(wrapper, [(3, 1)] * 6)  # every speculated round loses 2 ms
    assert [i + 1 for i, s in enumerate(on) if s] == [1, 2, 5, 10, 19, 28]
    report = wrapper.report()
    assert (report.rounds_speculated, report.probes, report.switch_offs) == (6, 4, 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 5)), min_size=1, max_size=80))
def test_the_excess_over_ar_stays_within_the_allowance_plus_one_round(rounds):
    rule = SwitchOffRule(overhead=0.03, grace_steps=2.0)
    wrapper = SwitchOff("all-small", CostPricer(), rule, depth=DEPTH)
    run_rounds(wrapper, rounds)
    report = wrapper.report()
    worst_loss = max(max(cost - tokens for cost, tokens in rounds), 0)
    allowance = rule.overhead * report.ar_priced_ms + rule.grace_steps * CostPricer.ar_ms
    assert report.priced_ms - report.ar_priced_ms <= allowance + worst_loss + 1e-9
