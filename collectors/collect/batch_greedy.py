"""Greedy continuations of several prompts in one batch: one target forward per step for all of them.

What it is for: a stage that needs only the target's greedy output of many prompts (the text an
exact walk follows), not a timed decode. On the zoo's deep, narrow targets a forward costs about
the same for one row as for twenty, so a batch of twenty prompts costs a few prompts' time.

How: the prompts are left-padded to one length; each row keeps its own positions (0 at its first
real token, so rotary embeddings see what an unbatched forward sees) and a [B, 1, q, kv] additive
mask hides the padding from every query. Padding changes which kernels run and in what order they
sum, so a row's logits may differ from an unbatched forward's in the last bits: at a near-tie the
argmax can differ. A caller that needs the target's own greedy output checks each continuation
against unbatched forwards (:func:`check_greedy`, or the forwards it needs anyway) and decodes a
failing prompt alone.

Stopping is autoregressive decoding's (decoder/core/outcome.py Output): a row ends after its first EOS
token (kept) or after ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from decoder.core.outcome import Output


def _mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, q, kv] additive mask: 0 where ``visible`` ([B, q, kv] bool), dtype-min elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


def greedy_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    vocab_size: int,
    eos_token_ids: Sequence[int] = (),
    batch_size: int = 20,
) -> list[list[int]]:
    """Each prompt's greedy continuation (argmax over the first ``vocab_size`` logits), decoded
    ``batch_size`` prompts at a time; rows stop as autoregressive decoding does. Empty prompts are
    refused."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("greedy_batch: an empty prompt has no last position to continue from")
    if max_new_tokens < 1:
        raise ValueError(f"greedy_batch: max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"greedy_batch: batch_size must be >= 1, got {batch_size}")
    out: list[list[int]] = []
    for lo in range(0, len(prompts), batch_size):
        out += _greedy_rows(model, prompts[lo : lo + batch_size], max_new_tokens, vocab_size, eos_token_ids)
    return out


@torch.inference_mode()
def _greedy_rows(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    vocab_size: int,
    eos_token_ids: Sequence[int],
) -> list[list[int]]:
    dev = model.device
    n, width = len(prompts), max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    pad = width - lengths
    ids = torch.zeros((n, width), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long, device=dev)
    columns = torch.arange(width, device=dev)
    real = columns[None] >= pad[:, None]  # [B, width]: which cached entries are real tokens
    causal = torch.ones((width, width), dtype=torch.bool, device=dev).tril_()
    cache = DynamicCache()
    out = model(
        input_ids=ids,
        position_ids=(columns[None] - pad[:, None]).clamp_(min=0),
        attention_mask=_mask(causal[None] & real[:, None, :], model.dtype),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    outputs = [Output(max_new_tokens, tuple(eos_token_ids)) for _ in prompts]
    step = 0
    while True:
        token = out.logits[:, -1, :vocab_size].argmax(-1)
        for o, t in zip(outputs, token.tolist(), strict=True):
            if not o.done:
                o.emit([t])
        if all(o.done for o in outputs):
            return [o.tokens for o in outputs]
        real = torch.cat([real, torch.ones((n, 1), dtype=torch.bool, device=dev)], dim=1)
        out = model(
            input_ids=token[:, None],
            position_ids=(lengths + step)[:, None],
            attention_mask=_mask(real[:, None, :], model.dtype),
            cache=cache,
            use_cache=True,
        )
        step += 1


# Logged (with the token's index) where a batched continuation fails its check and is decoded alone.
NOT_GREEDY = "batched continuation: token %d is not the target's greedy one; decoding"


@dataclass(frozen=True)
class GreedyCheck:
    """A continuation against the target's greedy choice after each of its prefixes."""

    tokens: list[int]
    greedy: list[int]  # the target's argmax after prompt + tokens[:i], for each i
    hidden: tuple[torch.Tensor, ...] | None  # the forward's per-layer hidden states, when asked

    @property
    def wrong(self) -> int | None:
        """The index of the first token that is not the target's greedy one; None when all are."""
        return next(
            (i for i, (a, t) in enumerate(zip(self.greedy, self.tokens, strict=True)) if a != t), None
        )

    @property
    def n_wrong(self) -> int:
        """Tokens that are not the target's greedy one after their (given) prefix."""
        return sum(a != t for a, t in zip(self.greedy, self.tokens, strict=True))


@torch.inference_mode()
def check_greedy(
    model: torch.nn.Module,
    prompt: Sequence[int],
    tokens: Sequence[int],
    vocab_size: int,
    hidden_states: bool = False,
) -> GreedyCheck:
    """Check ``tokens`` against the target's greedy choice after ``prompt`` with one unbatched causal
    forward of prompt + tokens[:-1] (with ``hidden_states``, keeping its per-layer hidden states)."""
    if not prompt or not tokens:
        raise ValueError("check_greedy needs a non-empty prompt and continuation")
    sequence = list(prompt) + list(tokens)
    ids = torch.tensor([sequence[:-1]], dtype=torch.long, device=model.device)
    out = model(input_ids=ids, output_hidden_states=hidden_states)
    greedy = out.logits[0, len(prompt) - 1 :, :vocab_size].argmax(-1).tolist()
    return GreedyCheck(list(tokens), greedy, out.hidden_states if hidden_states else None)
