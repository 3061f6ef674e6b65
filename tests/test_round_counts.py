"""Replay and execute mode hand the pricing the same counts, the new ones included: per mid call
the tree nodes already fed, the live tree size before the prune, the small steps' frontier, the
blocks of the prompt's top-m rows a round computes (decoding on first read; replay from its log)."""

from __future__ import annotations

import random

from conftest import noisy_copy, tiny_model

from collectors.collect.execute import execute_prompt
from collectors.collect.replay import Replayer
from decoder.core.config import DecodeConfig
from decoder.core.policies import schedule_bits
from decoder.models.pair import make_pair

SCHEDULES = [schedule_bits(s, 5) for s in range(32)]


def test_replay_counts_equal_execute_counts() -> None:
    target = tiny_model("qwen3", seed=61)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=62), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=16)
    rng = random.Random(63)
    base = [rng.randrange(1, 96) for _ in range(9)]
    prompt = [*(base * 4)[:30], 7]  # repetitive: the n-gram drafter finds chains
    rep = Replayer(pair, config, SCHEDULES).replay_prompt(prompt)
    sizes, frontiers, block_rounds = set(), set(), []
    for s, bits in enumerate(SCHEDULES):
        rounds, _ = execute_prompt(pair, prompt, bits, config)
        assert [r.counts() for r in rounds] == [r.counts() for r in rep.rounds[s]], bits
        blocks = [r.prompt_blocks for r in rounds]
        assert sum(blocks) <= 2  # 31 prompt positions: 2 blocks, each computed once a trajectory
        block_rounds.append(tuple(blocks))
        for r in rounds:
            counts = r.counts()
            assert counts.tree_nodes >= counts.verified_nodes and r.tree_nodes > 0
            assert 0 <= counts.small_frontier <= counts.small_steps * config.tree.width
            sizes.add(counts.tree_nodes)
            frontiers.add(counts.small_frontier)
    assert len(sizes) > 5 and len(frontiers) > 3  # the counts vary, so equality says something
    assert len(set(block_rounds)) > 1 and any(sum(b) for b in block_rounds)  # ... blocks included
