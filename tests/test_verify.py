"""Tree verification on stock HF models: logits equal per-path sequential logits; cache compaction."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import noisy_copy, tiny_model
from transformers import DynamicCache

from decoder.core.config import DecodeConfig
from decoder.core.mid import MidDrafter
from decoder.core.ngram import TargetLogpCache
from decoder.core.tensors import ROW_BLOCK, QueryBlock, causal_block, forward_block
from decoder.core.tree import DraftTree
from decoder.core.verify import PromptRows, TargetVerifier
from decoder.generate import generate
from decoder.models.pair import make_pair


def random_tree(root: int, vocab: int, n: int, seed: int) -> DraftTree:
    rng = random.Random(seed)
    tree = DraftTree(root)
    while len(tree) < n:
        tree.add_child(rng.randrange(len(tree)), rng.randrange(vocab), -rng.random())
    return tree


def sequential_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_tree_logits_equal_sequential_path_logits(arch):
    model = tiny_model(arch, seed=3)
    prompt = [random.Random(1).randrange(1, 96) for _ in range(30)]
    tree = random_tree(prompt[-1], 96, 40, seed=2)
    cache = DynamicCache()
    forward_block(model, cache, causal_block(prompt[:-1], 0, 0))
    block = QueryBlock(
        list(tree.tokens), tree.positions(len(prompt) - 1), tree.ancestor_mask(), len(prompt) - 1
    )
    logits = forward_block(model, cache, block)
    for v in range(len(tree)):
        expect = sequential_logits(model, prompt + tree.path_tokens(v))
        torch.testing.assert_close(logits[v], expect, atol=1e-4, rtol=1e-4)


def test_compaction_leaves_the_cache_of_the_committed_text():
    model = tiny_model("llama", seed=4)
    prompt = list(range(1, 21))
    verifier = TargetVerifier(model, 96, topk=4)
    verifier.prefill_context(prompt)
    tree = random_tree(prompt[-1], 96, 30, seed=5)
    # Graft the target's own greedy chain so that several tokens get accepted.
    v = 0
    for _ in range(3):
        v, _ = tree.add_child(v, int(sequential_logits(model, prompt + tree.path_tokens(v)).argmax()), -0.01)
    verdict = verifier.verify(tree, 0.0, np.random.default_rng(0))
    assert len(verdict.accepted) >= 3
    committed = prompt + [tree.tokens[a] for a in verdict.accepted]
    assert verifier.n_cached == len(committed) - 1 + 1  # root + accepted path kept, bonus not yet
    fresh = DynamicCache()
    forward_block(model, fresh, causal_block(committed, 0, 0))
    for old, new in zip(verifier.cache.layers, fresh.layers, strict=True):
        torch.testing.assert_close(old.keys, new.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(old.values, new.values, atol=1e-5, rtol=1e-4)


def test_mid_rescoring_matches_sequential_and_reuses_tree_kv():
    target = tiny_model("qwen3", seed=6)
    mid = noisy_copy(target, 0.2, seed=7)
    prompt = list(range(3, 40))
    drafter = MidDrafter(mid, 96)
    tree = random_tree(prompt[-1], 96, 12, seed=8)
    first = drafter.rescore(tree, prompt)
    assert first.n_catch_up == len(prompt) - 1 and first.n_tree_nodes == 12
    for v in range(6):
        tree.add_child(v, 50 + v, -1.0)
    second = drafter.rescore(tree, prompt)
    assert second.n_catch_up == 0 and second.n_tree_nodes == len(tree) - 12
    for v in range(1, len(tree)):
        logp = torch.log_softmax(sequential_logits(mid, prompt + tree.path_tokens(tree.parents[v])), -1)
        assert tree.edge_logp[v] == pytest.approx(float(logp[tree.tokens[v]]), abs=1e-4)
    kids, _ = drafter.top_children([0, 3], 5)
    expect = torch.topk(sequential_logits(mid, prompt + tree.path_tokens(3)), 5).indices.tolist()
    assert kids[1] == expect
    drafter.end_round([tree.children[0][next(iter(tree.children[0]))]])
    assert drafter.n_committed == len(prompt) + 1
    assert drafter.cache.get_seq_length() == drafter.n_committed


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_prefill_caches_the_whole_prompt_and_yields_the_baselines_first_logits(arch):
    model = tiny_model(arch, seed=31)
    prompt = [random.Random(8).randrange(1, 96) for _ in range(23)]
    verifier = TargetVerifier(model, 96, topk=5)
    head = verifier.prefill(prompt)
    assert verifier.n_cached == len(prompt)
    # the autoregressive baseline's prefill: the model's own forward, last position only
    ar = forward_block(model, DynamicCache(), causal_block(prompt, 0, 0), logits_to_keep=1)[-1]
    assert torch.equal(head.logits, ar)
    full = torch.log_softmax(forward_block(model, DynamicCache(), causal_block(prompt, 0, 0)), dim=-1)
    vals, ids = torch.topk(full, k=5, dim=-1)
    assert head.top.start == 0 and len(head.top.tokens) == len(prompt)
    assert head.top.tokens == ids.tolist()
    torch.testing.assert_close(torch.tensor(head.top.logps), vals, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", ["all-small", "10101"])
def test_a_speculative_decode_takes_one_target_forward_per_round_plus_the_prefill(monkeypatch, policy):
    """The first new token comes from the prefill, as in the baseline: a decode of n tokens with r
    rounds runs the target's body 1 + r times, and a one-token decode runs no round at all."""
    target = tiny_model("llama", seed=32)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=33), eos_token_ids=())
    body = target.get_decoder()
    calls = []
    forward = body.forward
    monkeypatch.setattr(body, "forward", lambda *a, **kw: calls.append(1) or forward(*a, **kw))
    prompt = [random.Random(9).randrange(1, 96) for _ in range(17)]
    ar = generate(pair, prompt, "ar", DecodeConfig(max_new_tokens=12))
    calls.clear()
    res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=12))
    assert res.new_tokens == ar.new_tokens
    assert len(calls) == 1 + len(res.rounds)
    assert sum(r.emitted for r in res.rounds) == 11
    one = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=1))
    assert one.new_tokens == ar.new_tokens[:1] and one.rounds == []


def test_prompt_rows_are_the_same_numbers_block_by_block_as_all_at_once():
    """The decoder reads a prompt's rows a block at a time, replay and profiling all at once: a
    position's row must not depend on which way it was asked for (tree shapes would differ)."""
    model = tiny_model("qwen3", seed=34)
    prompt = [random.Random(10).randrange(1, 96) for _ in range(2 * ROW_BLOCK + 5)]
    rows = TargetVerifier(model, 96, topk=5).prefill(prompt).rows
    assert rows.blocks_computed == 0  # the prefill itself runs the output head on the last row only
    every = rows.all()
    assert rows.blocks_computed == 3 and len(every.tokens) == len(prompt)
    for p in (0, ROW_BLOCK - 1, ROW_BLOCK, 2 * ROW_BLOCK + 4):
        block = rows.block(p)
        lo = p - p % ROW_BLOCK
        assert block.start == lo and block.start <= p < block.start + len(block.tokens)
        assert block.tokens == every.tokens[lo : lo + len(block.tokens)]
        assert block.logps == every.logps[lo : lo + len(block.logps)]  # exactly, not close
    with pytest.raises(IndexError, match="outside the prompt"):
        rows.block(len(prompt))


@pytest.mark.parametrize("policy", ["all-small", "10101"])
def test_a_decode_computes_prompt_rows_only_for_the_blocks_its_drafter_reads(monkeypatch, policy):
    """Lazily read prompt rows change nothing a decode does (the same tokens, rounds and tree
    sizes as with every row computed up front) and are computed only for blocks of positions the
    n-gram drafter read: a prompt that repeats one segment has every n-gram's latest occurrence,
    the one the drafter continues from, in its last two blocks."""
    target = tiny_model("llama", seed=35)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=36), eos_token_ids=())
    segment = random.Random(11).sample(range(1, 96), ROW_BLOCK)
    prompt = segment * 4 + segment[:3]  # 67 positions, 5 blocks
    cfg = DecodeConfig(max_new_tokens=24)
    eager = []

    def set_all(cache: TargetLogpCache, source) -> None:
        top = source.all()
        eager.append(source)
        cache.set_rows(top.start, top.tokens, top.logps)

    with monkeypatch.context() as m:
        m.setattr(TargetLogpCache, "set_source", set_all)
        want = generate(pair, prompt, policy, cfg)
    assert eager and eager[0].blocks_computed == 5
    sources, asked, read = [], [], []
    set_source, block, logp = TargetLogpCache.set_source, PromptRows.block, TargetLogpCache.logp
    monkeypatch.setattr(TargetLogpCache, "set_source", lambda c, s: sources.append(s) or set_source(c, s))
    monkeypatch.setattr(PromptRows, "block", lambda r, p: asked.append(p) or block(r, p))
    monkeypatch.setattr(TargetLogpCache, "logp", lambda c, p, t: read.append(p) or logp(c, p, t))
    got = generate(pair, prompt, policy, cfg)
    assert got.new_tokens == want.new_tokens
    strip = [(r.accepted, r.emitted, r.tree_size, r.verified_size, r.mid_calls) for r in got.rounds]
    assert strip == [(r.accepted, r.emitted, r.tree_size, r.verified_size, r.mid_calls) for r in want.rounds]
    read_blocks = {p // ROW_BLOCK for p in read if p < len(prompt)}
    assert read_blocks and read_blocks <= {3, 4}
    assert sorted(p // ROW_BLOCK for p in asked) == sorted(read_blocks)  # each read block once, no other
    assert sources[0].blocks_computed == len(read_blocks)
    # the rounds record each block in the round that computed it (the pricing charges it there)
    assert sum(r.prompt_blocks for r in got.rounds) == len(read_blocks)
    assert all(r.prompt_blocks == 0 for r in want.rounds)  # rows set up front: none computed in a round
