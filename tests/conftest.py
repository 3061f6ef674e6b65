"""Shared fixtures: tiny randomly initialised stock Qwen3 and Llama models, built from configs."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


def tiny_config(arch: str, vocab: int = 96, layers: int = 2, hidden: int = 64):
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    if arch == "qwen3":
        return Qwen3Config(head_dim=hidden // 4, **common)
    return LlamaConfig(**common)


def tiny_model(arch: str, seed: int, logit_scale: float = 4.0, **kw) -> torch.nn.Module:
    """A random model whose next-token distributions are peaked enough to make greedy choices clear."""
    torch.manual_seed(seed)
    cls = Qwen3ForCausalLM if arch == "qwen3" else LlamaForCausalLM
    model = cls(tiny_config(arch, **kw))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def repeated_prompts(n: int, seed: int, base: tuple[int, int], cut: tuple[int, int]) -> list[list[int]]:
    """n token prompts (ids 1..95) that repeat a random base three times, cut to a random length,
    plus one last random token: the n-gram drafter finds matches in them. ``base`` and ``cut`` are
    the half-open ranges of the base length and of the cut."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        motif = [rng.randrange(1, 96) for _ in range(rng.randrange(*base))]
        out.append([*(motif * 3)[: rng.randrange(*cut)], rng.randrange(1, 96)])
    return out


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """A mid drafter that tracks the target: same weights plus Gaussian noise."""
    torch.manual_seed(seed)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return twin.eval()


def train_tokenizer(texts: list[str], vocab: int) -> PreTrainedTokenizerFast:
    """A small byte-level BPE trained in the test itself, with an <eos> special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def save_pair(root: Path, tok: PreTrainedTokenizerFast, seed: int) -> None:
    """Save a random target and a noisy-copy mid drafter, each with the tokenizer, under root."""
    target = tiny_model("qwen3", seed=seed, vocab=len(tok))
    mid = noisy_copy(target, 0.3, seed=seed + 1)
    for name, model in (("target", target), ("mid", mid)):
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
