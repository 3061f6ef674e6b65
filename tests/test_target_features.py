"""The verifier's target features stay aligned with its cache, and cost nothing when not asked for."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import noisy_copy, tiny_model

from decoder.core.config import BlockConfig, DecodeConfig
from decoder.core.tree import DraftTree
from decoder.core.verify import TargetVerifier
from decoder.generate import generate
from decoder.graft.block import Marginals
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair


def fresh_features(model, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """Hidden states at `layers` of one full causal forward over tokens, concatenated per position."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1).float()


def greedy_tree(model, committed: list[int], rng: random.Random) -> DraftTree:
    """A random tree with the target's own greedy chain grafted in, so rounds accept several tokens."""
    tree = DraftTree(committed[-1])
    for _ in range(12):
        tree.add_child(rng.randrange(len(tree)), rng.randrange(96), -rng.random())
    v, path = 0, []
    for _ in range(rng.randrange(0, 4)):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([committed + path])).logits[0, -1]
        v, _ = tree.add_child(v, int(logits.argmax()), -0.01)
        path.append(tree.tokens[v])
    return tree


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("layers", [(0, 2), (1,), (2, 0, 1)])
def test_features_equal_a_fresh_forward_after_several_rounds(arch, layers):
    model = tiny_model(arch, seed=21)
    rng = random.Random(3)
    committed = [rng.randrange(1, 96) for _ in range(17)]
    verifier = TargetVerifier(model, 96, topk=4, feature_layers=layers)
    verifier.prefill_context(committed)
    accepted_total = 0
    for _ in range(6):
        tree = greedy_tree(model, committed, rng)
        verdict = verifier.verify(tree, 0.0, np.random.default_rng(0))
        accepted_total += len(verdict.accepted)
        committed += [tree.tokens[a] for a in verdict.accepted] + [verdict.bonus]
        feats = verifier.features
        assert (
            feats.shape == (verifier.n_cached, len(layers) * 64) and verifier.n_cached == len(committed) - 1
        )
        expect = fresh_features(model, committed[:-1], layers)
        torch.testing.assert_close(feats.float(), expect, atol=1e-5, rtol=1e-4)
    assert accepted_total >= 4, "rounds must keep accepted rows, not only roots"


def test_no_hidden_states_are_asked_for_when_no_layers_are(monkeypatch):
    model = tiny_model("qwen3", seed=22)
    seen: list[dict] = []
    forward = model.forward

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    body, body_forward = model.get_decoder(), model.get_decoder().forward
    monkeypatch.setattr(body, "forward", lambda *a, **kw: seen.append(kw) or body_forward(*a, **kw))
    verifier = TargetVerifier(model, 96, topk=4)
    verifier.prefill_context(list(range(1, 12)))
    verifier.verify(greedy_tree(model, list(range(1, 12)), random.Random(0)), 0.0, np.random.default_rng(0))
    assert verifier.features is None
    assert len(seen) >= 2 and not any(kw.get("output_hidden_states") for kw in seen)


def test_bad_feature_layers_are_refused():
    model = tiny_model("llama", seed=23)
    with pytest.raises(ValueError, match="outside"):
        TargetVerifier(model, 96, topk=4, feature_layers=(3,))


class CheckingProposer:
    """A proposer that reads target features: checks them against a fresh forward every round."""

    def __init__(self, inner: CausalLMProposer, target, layers: tuple[int, ...]) -> None:
        self.inner, self.target, self.target_layers, self.k = inner, target, layers, inner.k
        self.rounds = 0

    def propose(self, features: torch.Tensor | None, committed: list[int], topk: int) -> Marginals:
        assert features is not None and features.shape[0] == len(committed) - 1
        torch.testing.assert_close(
            features.float(),
            fresh_features(self.target, committed[:-1], self.target_layers),
            atol=1e-5,
            rtol=1e-4,
        )
        self.rounds += 1
        return self.inner.propose(None, committed, topk)


def test_the_ddtree_path_hands_aligned_features_to_the_proposer():
    target = tiny_model("qwen3", seed=24)
    mid = noisy_copy(target, 0.2, seed=25)
    pair = make_pair(target, mid, eos_token_ids=())
    proposer = CheckingProposer(CausalLMProposer(mid, 96, k=4), target, (0, 2))
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    res = generate(
        pair,
        prompt,
        "ddtree",
        DecodeConfig(max_new_tokens=24, block=BlockConfig(budget=20)),
        proposer=proposer,
    )
    assert proposer.rounds == len(res.rounds) >= 2
    assert sum(r.accepted for r in res.rounds) >= 2
