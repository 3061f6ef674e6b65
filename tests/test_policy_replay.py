"""Replaying a state-dependent scheduler gives exactly the rounds that real decoding gives.

The policy below looks at the tree (its size and frontier score) and at the history, so it calls
the mid drafter at different steps in different rounds: a replay that asked it with another
StepContext than RoundBuilder.build does, or built another tree, would diverge.
"""

from __future__ import annotations

import pytest
from conftest import noisy_copy, repeated_prompts, tiny_model

from collectors.collect.policy_replay import StepMemo, replay_policy
from collectors.collect.replay import Replayer
from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext, StepContext, schedule_bits
from decoder.core.state import step_signals, tree_signals
from decoder.generate import generate
from decoder.models.pair import make_pair


class TreeAware:
    """Invoke the mid drafter when the tree is small or its frontier is unsure; log every call."""

    def __init__(self, width: int) -> None:
        self.width, self.log = width, []

    def __call__(self, ctx: StepContext) -> bool:
        sig = tree_signals(ctx.state, self.width)
        decide = (sig[4] < 6 or sig[2] < -1.5) and sum(ctx.history) < 3 and ctx.runtime is not None
        self.log.append((ctx.step, ctx.history, ctx.mid_lag, decide))
        return decide


def _prompts(n: int, seed: int) -> list[list[int]]:
    return repeated_prompts(n, seed, base=(4, 12), cut=(10, 40))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_policy_replay_equals_real_decoding(arch: str) -> None:
    target = tiny_model(arch, seed=71)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=72), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    runtime = RuntimeContext(prompt_tokens=20, target_ms=2.0, mid_ms=1.0)
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], round_table_stride=0)
    mixed = 0
    for prompt in _prompts(3, seed=73):
        live, replayed = TreeAware(config.tree.width), TreeAware(config.tree.width)
        res = generate(pair, prompt, live, config, runtime=runtime)
        traj = replay_policy(replayer, replayer.inputs(prompt), replayed, runtime)
        assert replayed.log == live.log  # same questions, same answers, in the same order
        assert traj.n_tokens == res.decoded_tokens == len(res.new_tokens) - 1
        assert len(traj.rounds) == len(res.rounds)
        for real, rep in zip(res.rounds, traj.rounds, strict=True):
            mids = [s for s in real.steps if s.used_mid]
            assert rep.accepted == real.accepted and rep.emitted == real.emitted
            assert rep.verified_nodes == real.verified_size + 1
            assert rep.mid_tree_tokens == tuple(s.mid_tree_tokens for s in mids)
            assert rep.mid_catch_up == sum(s.mid_catch_up for s in mids)
            assert rep.small_steps == len(real.steps) - len(mids)
            assert rep.prompt_blocks == real.prompt_blocks  # the prompt rows it computed first
        mixed += len({d for *_, d in live.log}) == 2
        lags = {lag for _, history, lag, _ in live.log if not any(history)}
        assert len(lags) > 1  # the lag moves from round to round, so comparing it means something
    assert mixed >= 1, "the policy never mixed invoke and skip: the test would not tell replays apart"


def test_shared_inputs_give_the_same_fixed_schedule_replay() -> None:
    target = tiny_model("qwen3", seed=74)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=75), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=16)
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], round_table_stride=0)
    prompt = _prompts(1, seed=76)[0]
    fresh, shared = replayer.replay_prompt(prompt), replayer.replay_prompt(prompt, replayer.inputs(prompt))
    assert fresh.n_tokens == shared.n_tokens
    assert all(
        [r.counts() for r in fresh.rounds[s]] == [r.counts() for r in shared.rounds[s]] for s in range(32)
    )
    always = replay_policy(replayer, replayer.inputs(prompt), lambda ctx: True, None)
    assert [r.counts() for r in always.rounds] == [r.counts() for r in fresh.rounds[31]]


class Thresholded:
    """Invoke the mid drafter where the n-gram lookahead is short or the frontier unsure, at a given
    threshold; logs every step's signals (lookahead included), so a replay that handed a policy
    another tree or another n-gram view than its own would show it."""

    def __init__(self, width: int, threshold: float) -> None:
        self.width, self.threshold, self.log = width, threshold, []

    def __call__(self, ctx: StepContext) -> bool:
        sig = step_signals(ctx.state, self.width)
        decide = sig[2] < (self.threshold if sig[-1] < 2 else self.threshold - 2.0)
        self.log.append((ctx.step, ctx.history, sig, decide))
        return decide


def test_policies_sharing_a_step_memo_replay_as_they_would_alone() -> None:
    target = tiny_model("qwen3", seed=77)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=78), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    width = config.tree.width
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], round_table_stride=0)
    thresholds = (-13.0, -6.0, -3.7, -2.0, 0.5)
    hits, differ = 0, 0
    for prompt in _prompts(3, seed=79):
        inputs = replayer.inputs(prompt)
        alone = {t: Thresholded(width, t) for t in thresholds}
        shared = {t: Thresholded(width, t) for t in thresholds}
        memo = StepMemo()
        for t in thresholds:
            solo = replay_policy(replayer, inputs, alone[t], None)
            together = replay_policy(replayer, inputs, shared[t], None, memo)
            assert shared[t].log == alone[t].log  # same trees, same lookahead, same decisions
            assert together.bits == solo.bits and together.n_tokens == solo.n_tokens
            assert together.rounds == solo.rounds  # every count, blocks and mid calls included
        steps = sum(len(p.log) for p in shared.values())
        hits += steps - len(memo)
        differ += len({tuple(p.log) for p in shared.values()}) > 1
    assert differ > 0, "the thresholds never decided differently: nothing would diverge from the memo"
    assert hits > 0, "no policy ever reused a step: the memo was not exercised"
