"""The one adapter from draft trees to model inputs, and KV-cache surgery on stock HF caches.

Contract: a query block is a list of tokens with absolute positions on top of `prefix_len` cached
entries that every query sees. Its first `n_causal` queries are committed text (causal among
themselves); the others (tree nodes) see those plus what `visible` allows among the cache entries
that follow. A purely causal block is passed to the model without a mask (the model builds its own
causal mask, as in its own `generate`); any other block gets a float additive [1, 1, q, kv] mask
(0 = attend) built on the model's device, where only the new block's part comes from the host.
Host work per forward is O(q x new kv), never O(context).

Compaction keeps the accepted rows with a device-side index of length O(accepted) per layer, so
its cost does not grow with the context either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

# A prompt's top-m rows are computed this many positions at a time, in blocks aligned to position 0,
# and only for the blocks the n-gram drafter reads (decoder/core/verify.py PromptRows): a block's rows are
# the same numbers whether it is computed alone or with the others.
ROW_BLOCK = 16


def block_start(position: int) -> int:
    """The first position of the ROW_BLOCK-aligned block that holds ``position``."""
    return position - position % ROW_BLOCK


@dataclass(frozen=True)
class QueryBlock:
    """Tokens to run in one forward on top of `prefix_len` cached tokens."""

    tokens: list[int]
    positions: np.ndarray  # int64 [q]
    # bool [q - n_causal, kv - prefix_len - n_causal]: which entries after the causal part each
    # non-causal query sees; None iff the whole block is causal
    visible: np.ndarray | None
    prefix_len: int  # kv entries every query sees (the committed context in the cache)
    n_causal: int = 0  # leading queries that are committed text: causal, seen by every later query

    def __post_init__(self) -> None:
        q = len(self.tokens)
        if self.positions.shape != (q,):
            raise ValueError(f"positions has shape {self.positions.shape}, expected ({q},)")
        if not 0 <= self.n_causal <= q:
            raise ValueError(f"n_causal {self.n_causal} outside [0, {q}]")
        if (self.visible is None) != (self.n_causal == q):
            raise ValueError("visible must be None exactly when the whole block is causal")
        if self.visible is not None and self.visible.shape[0] != q - self.n_causal:
            raise ValueError(f"visible has {self.visible.shape[0]} rows for {q - self.n_causal} queries")

    @property
    def is_causal(self) -> bool:
        return self.visible is None

    @property
    def kv_len(self) -> int:
        """Cache length the block's queries attend over (after the forward)."""
        extra = 0 if self.visible is None else self.visible.shape[1]
        return self.prefix_len + self.n_causal + extra


def additive_mask(block: QueryBlock, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, q, kv] float mask on `device`: 0 where visible, dtype-min elsewhere.

    The prefix columns are a device-side fill; only the new block's [q, kv - prefix] part is built
    from host data (and the causal part is a device triangle).
    """
    q, c, p = len(block.tokens), block.n_causal, block.prefix_len
    lowest = torch.finfo(dtype).min
    mask = torch.zeros((q, block.kv_len), dtype=dtype, device=device)
    if c:
        above = torch.ones((c, c), dtype=torch.bool, device=device).triu_(1)
        mask[:c, p : p + c].masked_fill_(above, lowest)
        mask[:c, p + c :] = lowest
    if block.visible is not None:
        hidden = torch.from_numpy(~block.visible).to(device, non_blocking=True)
        mask[c:, p + c :].masked_fill_(hidden, lowest)
    return mask[None, None]


def _model_inputs(model: torch.nn.Module, block: QueryBlock) -> dict:
    device = model.device
    inputs = {
        "input_ids": torch.tensor([block.tokens], dtype=torch.long, device=device),
        "position_ids": torch.from_numpy(block.positions).to(device)[None],
    }
    if not block.is_causal:
        inputs["attention_mask"] = additive_mask(block, model.dtype, device)
    return inputs


def _check_cache(cache: DynamicCache, block: QueryBlock) -> None:
    have = cache.get_seq_length()
    if have + len(block.tokens) != block.kv_len:
        raise ValueError(
            f"block expects {block.kv_len - len(block.tokens)} cached entries, the cache holds {have}"
        )


@torch.inference_mode()
def forward_block(
    model: torch.nn.Module,
    cache: DynamicCache,
    block: QueryBlock,
    logits_to_keep: int = 0,
    upcast: bool = True,
) -> torch.Tensor:
    """Run the block on top of the cache (which grows by q entries); return fp32 logits.

    logits_to_keep = 0 returns [q, V]; n > 0 returns only the last n rows [n, V] (the model then
    never materialises the others). upcast=False returns them in the model's dtype (for a caller
    that converts only the rows it reads).
    """
    _check_cache(cache, block)
    out = model(**_model_inputs(model, block), cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return out.logits[0].float() if upcast else out.logits[0]


def layer_features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """[q, len(layers) * H]: HF's per-layer hidden states of one sequence, concatenated per position."""
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)


@torch.inference_mode()
def forward_block_features(
    model: torch.nn.Module, cache: DynamicCache, block: QueryBlock, layers: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """forward_block that also returns the hidden states at `layers` ([q, V] fp32, [q, L * H])."""
    _check_cache(cache, block)
    out = model(**_model_inputs(model, block), cache=cache, use_cache=True, output_hidden_states=True)
    return out.logits[0].float(), layer_features(out.hidden_states, layers)


@torch.inference_mode()
def forward_prefill(
    model: torch.nn.Module,
    cache: DynamicCache,
    block: QueryBlock,
    vocab_size: int,
    layers: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward over a causal block (a prompt): the final hidden state of every query [q, H]
    (for `top_logps_of`, on demand), the last query's fp32 next-token logits [V], and the hidden
    states at `layers` ([q, L * H], None when no layers are asked).

    The output head runs on the last row only, exactly as the model's own forward does with
    logits_to_keep=1 (the [1, 1, H] slice, softcapping in the model's dtype, then fp32), so the
    first token drawn from it is the autoregressive baseline's first token.
    """
    if not block.is_causal or not block.tokens:
        raise ValueError("a prefill block is a non-empty causal block")
    _check_cache(cache, block)
    body = model.get_decoder()
    out = body(**_model_inputs(model, block), cache=cache, use_cache=True, output_hidden_states=bool(layers))
    hidden = out.last_hidden_state
    last = _softcap(model, model.get_output_embeddings()(hidden[:, -1:, :]))
    feats = layer_features(out.hidden_states, layers) if layers else None
    return hidden[0], last[0, -1, :vocab_size].float(), feats


def _softcap(model: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """The model's final-logit softcapping (Gemma-style), as its own forward applies it; none set:
    the logits unchanged."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@torch.inference_mode()
def top_logps_of(
    model: torch.nn.Module, hidden: torch.Tensor, vocab_size: int, m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-m (log-probs, ids) of the output head over final hidden states [n, H], each [n, m]."""
    k = min(m, vocab_size)
    if hidden.shape[0] == 0:
        empty = torch.zeros((0, k), device=hidden.device)
        return empty, empty.long()
    logits = _softcap(model, model.get_output_embeddings()(hidden)[:, :vocab_size].float())
    top, idx = torch.topk(logits, k=k, dim=-1)
    return top - torch.logsumexp(logits, dim=-1, keepdim=True), idx


def causal_block(tokens: list[int], start: int, prefix_len: int) -> QueryBlock:
    """A plain causal block of committed tokens at positions start, start+1, ..."""
    q = len(tokens)
    return QueryBlock(
        tokens=list(tokens),
        positions=np.arange(start, start + q, dtype=np.int64),
        visible=None,
        prefix_len=prefix_len,
        n_causal=q,
    )


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop every cached entry from `length` on (this transformers' crop takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def compact_cache(cache: DynamicCache, keep_prefix: int, keep_rows: list[int]) -> None:
    """Keep entries [0, keep_prefix) plus the listed later entries, in that order; drop the rest.

    Rows already in place (the root, and any accepted path that starts with the tree's first
    nodes) stay; the others are gathered with one device index of at most len(keep_rows) entries,
    written right after them, and the cache is cropped: O(accepted) work per layer, whatever the
    context length.
    """
    rows = [r for r in keep_rows if r >= keep_prefix]
    n = len(rows)
    first = next((i for i, r in enumerate(rows) if r != keep_prefix + i), n)
    if first == n:
        crop_cache(cache, keep_prefix + n)
        return
    moved = rows[first:]
    index: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        dev = layer.keys.device
        if dev not in index:
            index[dev] = torch.tensor(moved, dtype=torch.long, device=dev)
        idx = index[dev]
        for name in ("keys", "values"):
            t = getattr(layer, name)
            picked = t.index_select(-2, idx)  # a copy: safe to write over overlapping rows
            t[..., keep_prefix + first : keep_prefix + n, :] = picked
            setattr(layer, name, t[..., : keep_prefix + n, :])
