"""Draftless rounds: a round whose pruned tree holds no drafted node runs as the autoregressive
baseline's own one-token step (no tree verify, no mask), with the same tokens, cache and rows."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache

import decoder.core.tensors
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.records import DRAFTLESS, TREE, RoundModes
from decoder.core.tensors import causal_block, forward_block
from decoder.core.tree import DraftTree
from decoder.core.verify import TargetVerifier
from decoder.generate import generate
from decoder.models.pair import make_pair

# the per-round budget rule with a dear verify: most rounds choose B = 0 (nothing worth verifying)
RULE = TreeConfig(
    budget=6, width=2, topk=2, verify_ms=tuple(1.0 + 0.6 * b for b in range(7)), round_fixed_ms=0.2
)
TREES = {"plain": TreeConfig(budget=12, width=3, topk=3), "rule": RULE}


def reference(model: torch.nn.Module, prompt: list[int], max_new: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


def counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("tree", list(TREES))
def test_draftless_rounds_are_lossless_and_run_no_tree_verify(monkeypatch, arch, tree):
    target = tiny_model(arch, seed=41)
    pair = make_pair(target, None, eos_token_ids=())
    rng = random.Random(42)
    prompt = [rng.randrange(1, 96) for _ in range(14)]  # no repeats: the n-gram drafter often finds nothing
    want = reference(target, prompt, 40)
    verifies = counting(monkeypatch, TargetVerifier, "verify")
    masks = counting(monkeypatch, decoder.core.tensors, "additive_mask")
    res = generate(pair, prompt, "all-small", DecodeConfig(max_new_tokens=40, tree=TREES[tree]))
    assert res.new_tokens == want
    modes = RoundModes.of(res.rounds)
    assert modes.draftless > 0 and modes.switched_off == 0
    assert len(verifies) == len(masks) == modes.verified  # every other round: no verify, no mask
    for r in res.rounds:
        assert (r.mode == DRAFTLESS) == (r.verified_size == 0)
        assert r.mode == TREE or (r.accepted == 0 and r.emitted == 1 and r.is_ar_step)
    assert sum(r.emitted for r in res.rounds) == len(want) - 1
    assert res.modes == modes and modes.as_ar == modes.draftless


def test_a_step_leaves_the_cache_as_the_baseline_and_the_verdict_as_a_bare_root_verify():
    model = tiny_model("qwen3", seed=43)
    prompt = [random.Random(44).randrange(1, 96) for _ in range(21)]
    stepping, verifying = TargetVerifier(model, 96, topk=4), TargetVerifier(model, 96, topk=4)
    head = stepping.prefill(prompt)
    verifying.prefill(prompt)
    baseline = DynamicCache()  # the AR baseline's own calls (decoder.core.decode.autoregressive)
    logits = forward_block(model, baseline, causal_block(prompt, 0, 0), logits_to_keep=1)[-1]
    assert torch.equal(logits, head.logits)
    root = int(logits.argmax())
    for _ in range(5):
        a = stepping.step(root, 0.0, np.random.default_rng(0))
        b = verifying.verify(DraftTree(root), 0.0, np.random.default_rng(0))
        pos = baseline.get_seq_length()
        logits = forward_block(model, baseline, causal_block([root], pos, pos), logits_to_keep=1)[-1]
        assert a.accepted == b.accepted == [] and a.bonus == b.bonus == int(logits.argmax())
        assert a.top.start == b.top.start == pos and a.top.tokens == b.top.tokens
        np.testing.assert_allclose(a.top.logps, b.top.logps, atol=1e-5)
        for mine, theirs in zip(stepping.cache.layers, baseline.layers, strict=True):
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
        root = a.bonus
    assert stepping.n_cached == verifying.n_cached == len(prompt) + 5


def test_sampled_draftless_rounds_draw_what_a_bare_root_verify_draws(monkeypatch):
    """At temperature > 0 a step consumes the generator as a bare-root verify does: the same seed
    decodes the same tokens whichever of the two runs the draftless rounds."""
    target = tiny_model("llama", seed=45)
    pair = make_pair(target, None, eos_token_ids=())
    prompt = [random.Random(46).randrange(1, 96) for _ in range(12)]
    config = DecodeConfig(max_new_tokens=30, temperature=0.9, seed=7, tree=RULE)
    stepped = generate(pair, prompt, "all-small", config)
    monkeypatch.setattr(
        TargetVerifier, "step", lambda self, root, t, rng: self.verify(DraftTree(root), t, rng)
    )
    verified = generate(pair, prompt, "all-small", config)
    assert stepped.new_tokens == verified.new_tokens
    assert stepped.modes.draftless > 0
    strip = [(r.accepted, r.emitted, r.tree_size, r.verified_size, r.steps, r.mode) for r in stepped.rounds]
    assert strip == [
        (r.accepted, r.emitted, r.tree_size, r.verified_size, r.steps, r.mode) for r in verified.rounds
    ]
