"""The one adapter from draft trees to model inputs, and KV-cache surgery on stock HF caches.

Contract: a query block is a list of tokens with absolute positions and a boolean visibility
matrix over [cached prefix | query block]. Masks are float additive [1, 1, q, kv] (0 = attend),
which stock transformers models accept unchanged together with explicit position_ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class QueryBlock:
    """Tokens to run in one forward on top of `prefix_len` cached tokens."""

    tokens: list[int]
    positions: np.ndarray  # int64 [q]
    visible: np.ndarray  # bool [q, kv - prefix_len]: which non-prefix kv entries each query sees
    prefix_len: int  # kv entries every query sees (the committed context in the cache)


def additive_mask(block: QueryBlock, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, q, prefix + k] float mask: 0 where visible, dtype-min elsewhere."""
    q = len(block.tokens)
    visible = np.concatenate([np.ones((q, block.prefix_len), dtype=bool), block.visible], axis=1)
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~visible), torch.finfo(dtype).min)
    return mask.to(device)[None, None]


@torch.inference_mode()
def forward_block(model: torch.nn.Module, cache: DynamicCache, block: QueryBlock) -> torch.Tensor:
    """Run the block on top of the cache (which grows by q entries); return logits [q, V]."""
    device = model.device
    ids = torch.tensor([block.tokens], dtype=torch.long, device=device)
    pos = torch.from_numpy(block.positions).to(device)[None]
    mask = additive_mask(block, model.dtype, device)
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
    return out.logits[0].float()


def causal_block(tokens: list[int], start: int, prefix_len: int) -> QueryBlock:
    """A plain causal block of committed tokens at positions start, start+1, ..."""
    q = len(tokens)
    return QueryBlock(
        tokens=list(tokens),
        positions=np.arange(start, start + q, dtype=np.int64),
        visible=np.tril(np.ones((q, q), dtype=bool)),
        prefix_len=prefix_len,
    )


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop every cached entry from `length` on (this transformers' crop takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def compact_cache(cache: DynamicCache, keep_prefix: int, keep_rows: list[int]) -> None:
    """Keep entries [0, keep_prefix) plus the listed later entries, in that order; drop the rest."""
    rows = [r for r in keep_rows if r >= keep_prefix]
    if rows == list(range(keep_prefix, keep_prefix + len(rows))):
        crop_cache(cache, keep_prefix + len(rows))
        return
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        idx = torch.tensor(list(range(keep_prefix)) + rows, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
