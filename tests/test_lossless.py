"""Losslessness: every policy's greedy output equals the target's own generate(do_sample=False)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import noisy_copy, tiny_model

from decoder.core.config import DecodeConfig, Grafting, TreeConfig
from decoder.core.policies import StepContext
from decoder.generate import generate
from decoder.models.pair import make_pair

EOS = 0


def reference(model, prompt: list[int], max_new: int, eos: int | None = EOS) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=EOS,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


def prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    """Random prompts with repeated spans, so the n-gram drafter finds matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(1, vocab) for _ in range(rng.randrange(5, 25))]
        out.append([*(base * 3)[: rng.randrange(8, 60)], rng.randrange(1, vocab)])
    return out


def coin_scheduler(ctx: StepContext) -> bool:
    """A pluggable scheduler that depends on the live tree, to exercise arbitrary schedules."""
    return (len(ctx.state.tree) + ctx.step + sum(ctx.history)) % 3 == 0


POLICIES = ["ar", "all-small", "all-mid", "10101", "01100", coin_scheduler]
TREES = {
    "default": TreeConfig(),
    "no-extended-grafting": TreeConfig(extended_grafting=False),
    "overwrite": TreeConfig(grafting=Grafting.OVERWRITE),
    "narrow": TreeConfig(depth=3, width=2, topk=2, budget=5, ngram_chain_len=2),
    "sequential-cascade": TreeConfig(sequential=True),
}


@pytest.fixture(scope="module")
def pairs():
    made = {}
    for arch in ("qwen3", "llama"):
        target = tiny_model(arch, seed=11)
        mid = noisy_copy(target, noise=0.3, seed=12)
        made[arch] = make_pair(target, mid, eos_token_ids=(EOS,))
    return made


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("tree_name", list(TREES))
def test_every_policy_is_token_identical(pairs, arch, tree_name):
    pair = pairs[arch]
    tree_cfg = TREES[tree_name]
    accepted = []
    for prompt in prompts(pair.vocab_size, 3, seed=list(TREES).index(tree_name)):
        ref = reference(pair.target, prompt, 40)
        for policy in POLICIES:
            if tree_name != "default" and policy == "ar":
                continue
            if tree_cfg.depth != 5 and isinstance(policy, str) and len(policy) == 5:
                policy = policy[: tree_cfg.depth]
            res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=40, tree=tree_cfg))
            assert res.new_tokens == ref, f"{arch} {tree_name} {policy}"
            accepted += [r.accepted for r in res.rounds]
    assert max(accepted) >= 2, "trees never got past depth 1: the test would not exercise compaction"


def test_stops_right_after_eos(pairs):
    pair = pairs["qwen3"]
    prompt = prompts(pair.vocab_size, 1, seed=5)[0]
    free = reference(pair.target, prompt, 30, eos=None)
    k = next(i for i in range(3, len(free)) if free[i] not in free[:i])
    eos_pair = make_pair(pair.target, pair.mid, eos_token_ids=(free[k],))
    ref = reference(pair.target, prompt, 30, eos=free[k])
    assert ref == free[: k + 1]
    for policy in ["ar", "all-small", "all-mid", "10101"]:
        res = generate(eos_pair, prompt, policy, DecodeConfig(max_new_tokens=30))
        assert res.new_tokens == ref and res.stopped_at_eos
        assert policy == "ar" or sum(r.emitted for r in res.rounds) == res.decoded_tokens == len(ref) - 1


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_never_overshoots_max_new_tokens(pairs, max_new):
    pair = pairs["llama"]
    for prompt in prompts(pair.vocab_size, 3, seed=9):
        ref = reference(pair.target, prompt, max_new)
        for policy in ["ar", "all-small", "all-mid", "11011"]:
            res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=max_new))
            assert res.new_tokens == ref
            assert len(res.new_tokens) <= max_new


def test_single_token_prompt(pairs):
    pair = pairs["qwen3"]
    ref = reference(pair.target, [5], 20)
    for policy in ["all-small", "all-mid"]:
        assert generate(pair, [5], policy, DecodeConfig(max_new_tokens=20)).new_tokens == ref
