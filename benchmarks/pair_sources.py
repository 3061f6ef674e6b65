"""Pairs and prompts for the latency benchmarks: a registered (zoo) pair by name, or a tiny pair.

`tiny` is built on the spot (random 4-layer Qwen3 target, its noisy copy as the mid drafter), for
when the zoo is not built yet; its text is random, so its numbers say nothing about a real pair.
Prompts are the embedded benchmark questions when the data stage has run, else stretches of this
Python's standard library source (real text with the repetition n-gram drafting feeds on).
"""

from __future__ import annotations

import copy
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from collectors.data.prompts import encode_prompts, load_benchmarks
from collectors.pricing.profile_rounds import reference_context
from config.params import Params, resolve
from decoder.models.pair import ModelPair, load_pair, make_pair

log = logging.getLogger(__name__)
TINY = "tiny"


def tiny_pair(seed: int = 0) -> ModelPair:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    target = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaked next-token distributions, as trained models have
    mid = copy.deepcopy(target)
    with torch.no_grad():
        for p in mid.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    return make_pair(target, mid.eval(), eos_token_ids=())


def load_named(params: Params, name: str) -> ModelPair:
    """A registered pair, or the tiny pair for the name `tiny`."""
    if name == TINY:
        return tiny_pair()
    target, mid = params.pair_paths(name)
    spec = params.pairs[name]
    return load_pair(target, mid, spec.dtype, spec.device, spec.linear)


def bench_prompts(params: Params, name: str, pair: ModelPair, n: int, max_tokens: int) -> list[list[int]]:
    """n prompts: the first question of each embedded dataset in turn, else stdlib stretches."""
    root = resolve(params.data.out_dir)
    if name != TINY and pair.tokenizer is not None and root.exists():
        benches = load_benchmarks(root, list(params.data.datasets))
        questions = [qs[i] for i in range(n) for qs in benches.values() if i < len(qs)][:n]
        if len(questions) == n:
            return encode_prompts(questions, pair.tokenizer, params.pairs[name].template, max_tokens)
    log.info("%s: prompts from the stdlib source (no embedded data)", name)
    stream = reference_context(pair, (n + 2) * max_tokens)
    return [
        stream[(i + 2) * max_tokens : (i + 3) * max_tokens] for i in range(n)
    ]  # not the profile's context
