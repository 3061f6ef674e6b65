"""End to end: speculative sampling at temperature > 0 draws from the target's own distribution."""

from __future__ import annotations

import numpy as np
import torch
from conftest import noisy_copy, tiny_model
from test_sampling import chi2_pvalue_ok

from decoder.core.config import DecodeConfig
from decoder.generate import generate
from decoder.models.pair import make_pair

V = 8
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def exact_joint(model, temperature: float) -> np.ndarray:
    """p(t1, t2 | prompt) over V x V, from direct target forwards."""
    with torch.inference_mode():
        first = torch.softmax(model(input_ids=torch.tensor([PROMPT])).logits[0, -1] / temperature, -1)
        joint = np.zeros((V, V))
        for t in range(V):
            logits = model(input_ids=torch.tensor([[*PROMPT, t]])).logits[0, -1]
            joint[t] = first[t].item() * torch.softmax(logits / temperature, -1).numpy()
    return joint.ravel()


def check_two_token_joint(policy: str, **config) -> None:
    """1,500 seeds of two sampled tokens from a tiny Llama target with a noisy-copy drafter, decoded
    speculatively by ``policy``: their joint must pass a chi-square test against the target's own."""
    target = tiny_model("llama", seed=31, vocab=V, logit_scale=1.5)
    pair = make_pair(target, noisy_copy(target, 0.2, seed=32), eos_token_ids=())
    temperature = 0.8
    n = 1500
    counts = np.zeros(V * V)
    accepted = 0
    for seed in range(n):
        cfg = DecodeConfig(max_new_tokens=2, temperature=temperature, seed=seed, **config)
        res = generate(pair, PROMPT, policy, cfg)
        a, b = res.new_tokens
        counts[a * V + b] += 1
        accepted += res.rounds[0].accepted
    assert accepted > n // 4, "drafts were rarely accepted: the test would only check residual draws"
    assert chi2_pvalue_ok(counts, exact_joint(target, temperature), n)


def test_speculative_sampling_preserves_the_target_distribution():
    check_two_token_joint("all-mid")
