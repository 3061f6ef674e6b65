"""Target-side work: prefill, one tree-verification forward per round, KV compaction.

Contract: the target's cache always holds the committed context except its last token (the root
of the next tree). `prefill` runs the whole prompt, as the autoregressive baseline's prefill does,
and hands back the logits after it: the first new token comes from the prefill, not from a round,
so a speculative decode takes no more target forwards than the baseline for the same output.
`verify` runs the root and the pruned tree in one forward with a 4D ancestor
mask, picks the accepted path (greedy, or lossless rejection sampling at temperature > 0), keeps
the KV of the root and the accepted path only, and hands back the target's top-m log-probs at
those positions so the n-gram drafter's score cache stays fresh. A round with no drafted node
calls `step` instead: the autoregressive baseline's own one-token step (`decode_one`: no mask, the
output head on one row), which leaves the cache and the root's top-m row as a bare-root verify
would, and draws the token with the same rule and the same draws from the generator.

Optionally (`feature_layers`, for block drafters: decoder/graft/block.py) the same forwards also return
the hidden states at those layers, and the verifier keeps the rows of every cached position in
`features`, aligned with the cache. With no layers asked nothing of this runs (no
output_hidden_states), so the other policies pay nothing.

Host work per round does not grow with the context: the mask is built on the device for the new
block only, compaction gathers O(accepted) rows, greedy acceptance brings one argmax per node to the
host and sampling keeps the probability rows on the device (decoder/core/device_rows.py). Prefill runs
the output head on the last position only; the prompt's top-m rows come from its final hidden
states on demand, a block of positions at a time, only for the blocks the n-gram drafter reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from transformers import DynamicCache

from decoder.core.device_rows import TorchRow, next_token
from decoder.core.feature_rows import FeatureRows, check_feature_layers
from decoder.core.sampling import sample_walk
from decoder.core.tensors import (
    ROW_BLOCK,
    QueryBlock,
    block_start,
    causal_block,
    compact_cache,
    forward_block,
    forward_block_features,
    forward_prefill,
    top_logps_of,
)
from decoder.core.tree import DraftTree


@dataclass(frozen=True)
class TopLogps:
    """Top-m next-token log-probs for consecutive committed positions starting at `start`."""

    start: int
    tokens: list[list[int]]
    logps: list[list[float]]


class PromptRows:
    """A prompt's top-m rows (positions 0..L-1), computed from the prefill's final hidden states
    ROW_BLOCK positions at a time (blocks aligned to position 0), only when asked.

    The n-gram drafter reads the rows of the positions its matches continue from, often few of a
    prompt's, and a row costs the output head over the whole vocabulary (on a 150k-token vocabulary
    in fp32 on a CPU, a prompt's rows cost about one autoregressive step per 20 positions).
    `block(p)` returns the rows of the block holding p; `all()` every block in turn, so a row is the
    same number whichever way it was asked for. Nothing is cached here (the caller keeps what it
    reads: TargetLogpCache); `blocks_computed` counts the blocks computed."""

    def __init__(self, model: torch.nn.Module, hidden: torch.Tensor, vocab_size: int, m: int) -> None:
        self._model, self._hidden, self._vocab_size, self._m = model, hidden, vocab_size, m
        self.start = 0
        self.count = int(hidden.shape[0])
        self.blocks_computed = 0

    def block(self, position: int) -> TopLogps:
        if not 0 <= position < self.count:
            raise IndexError(f"position {position} is outside the prompt's rows 0..{self.count - 1}")
        lo = block_start(position)
        vals, ids = top_logps_of(self._model, self._hidden[lo : lo + ROW_BLOCK], self._vocab_size, self._m)
        self.blocks_computed += 1
        return TopLogps(start=lo, tokens=ids.tolist(), logps=vals.tolist())

    def all(self) -> TopLogps:
        blocks = [self.block(p) for p in range(0, self.count, ROW_BLOCK)]
        return TopLogps(0, [r for b in blocks for r in b.tokens], [r for b in blocks for r in b.logps])


@dataclass(frozen=True)
class Prefill:
    """What a prompt's prefill hands the loop: the top-m rows of every prompt position (0..L-1), on
    demand, and the target's fp32 next-token logits [V] after the whole prompt (the first new
    token's row)."""

    rows: PromptRows
    logits: torch.Tensor

    @property
    def top(self) -> TopLogps:
        """Every prompt position's rows, computed now (for replay and profiling; decoding reads
        them lazily through TargetLogpCache.set_source)."""
        return self.rows.all()


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification: accepted nodes of the verified tree, bonus token, fresh scores."""

    accepted: list[int]
    bonus: int
    top: TopLogps


class Verifier(Protocol):
    """What the speculative loop needs from the target side (TargetVerifier is the real one)."""

    def prefill(self, prompt: list[int]) -> Prefill: ...

    def verify(self, tree: DraftTree, temperature: float, rng: np.random.Generator) -> Verdict: ...


@runtime_checkable
class SteppingVerifier(Verifier, Protocol):
    """A Verifier that also runs a round with no drafted node as one autoregressive step. The loop
    uses `step` where a verifier has it; a stand-in without it (benchmarks/bench_decoder.py's)
    verifies the bare root instead, with the same outcome."""

    def step(self, root: int, temperature: float, rng: np.random.Generator) -> Verdict: ...


@torch.inference_mode()
def decode_one(model: torch.nn.Module, cache: DynamicCache, token: int, vocab_size: int) -> torch.Tensor:
    """The autoregressive step: `token` at the next position on top of the cache (which grows by
    one), no mask, the output head on that one row; its fp32 next-token logits [V]."""
    pos = cache.get_seq_length()
    return forward_block(model, cache, causal_block([token], pos, pos), logits_to_keep=1)[-1, :vocab_size]


def top_logps(logits: torch.Tensor, m: int, start: int) -> TopLogps:
    vals, ids = torch.topk(torch.log_softmax(logits, dim=-1), k=min(m, logits.shape[-1]), dim=-1)
    return TopLogps(start=start, tokens=ids.tolist(), logps=vals.tolist())


class TargetVerifier:
    """Owns the target model's KV cache for one generation."""

    def __init__(
        self, model: torch.nn.Module, vocab_size: int, topk: int, feature_layers: tuple[int, ...] = ()
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.topk = topk
        self.cache = DynamicCache()
        self.feature_layers = check_feature_layers(model, feature_layers)
        self._features: FeatureRows | None = None
        if self.feature_layers:
            width = len(self.feature_layers) * int(model.config.hidden_size)
            self._features = FeatureRows(width, model.dtype, model.device)

    @property
    def features(self) -> torch.Tensor | None:
        """[n_cached, len(feature_layers) * hidden] target hidden states, None when none are kept."""
        return None if self._features is None else self._features.view()

    @property
    def n_cached(self) -> int:
        return self.cache.get_seq_length()

    def prefill(self, prompt: list[int]) -> Prefill:
        """Cache the whole prompt; return its top-m rows (positions 0..L-1, computed on demand) and
        the logits after it.

        The caller commits the first new token drawn from those logits; the cache then holds the
        committed context except its last token, which roots the first round."""
        if not prompt:
            raise ValueError("the prompt is empty: a prefill needs at least one token")
        block = causal_block(list(prompt), 0, 0)
        layers = self.feature_layers if self._features is not None else ()
        hidden, logits, feats = forward_prefill(self.model, self.cache, block, self.vocab_size, layers)
        if self._features is not None:
            self._features.append(feats)
        return Prefill(PromptRows(self.model, hidden, self.vocab_size, self.topk), logits)

    def prefill_context(self, context: list[int]) -> TopLogps:
        """Cache a reference context but its last token (the root of the trees the caller verifies
        or times on it); return top-m log-probs for positions 0..L-2. For profiling and tests that
        need a round on a given context, not for decoding (which uses `prefill`)."""
        if len(context) < 2:
            return TopLogps(start=0, tokens=[], logps=[])
        return self.prefill(context[:-1]).top

    def step(self, root: int, temperature: float, rng: np.random.Generator) -> Verdict:
        """A round with no drafted node, as the autoregressive baseline runs it (`decode_one`): the
        cache gains the root's row, the verdict accepts nothing and carries the root's top-m row.
        At temperature > 0 the token is drawn as `verify` draws a bare root's bonus (one uniform
        from rng), so the generator's stream does not depend on which of the two ran. Kept target
        features need the hidden states a one-token step does not return: `verify` runs then."""
        if self._features is not None:
            return self.verify(DraftTree(root), temperature, rng)
        prefix = self.n_cached
        logits = decode_one(self.model, self.cache, root, self.vocab_size)
        bonus = next_token(logits, temperature, rng)
        return Verdict(accepted=[], bonus=bonus, top=top_logps(logits[None], self.topk, prefix))

    def verify(self, tree: DraftTree, temperature: float, rng: np.random.Generator) -> Verdict:
        """One forward over root + tree; accept, compact the cache, return the verdict."""
        prefix = self.n_cached
        block = QueryBlock(
            tokens=list(tree.tokens),
            positions=tree.positions(prefix),
            visible=tree.ancestor_mask(),
            prefix_len=prefix,
        )
        if self._features is None:
            logits = forward_block(self.model, self.cache, block)[:, : self.vocab_size]
        else:
            logits, feats = forward_block_features(self.model, self.cache, block, self.feature_layers)
            logits = logits[:, : self.vocab_size]
        if temperature == 0:
            target_next = logits.argmax(dim=-1).tolist()
            accepted = tree.greedy_accept(target_next)
            bonus = int(target_next[accepted[-1] if accepted else 0])
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            accepted, bonus = sample_walk(tree, lambda v: TorchRow(probs[v]), rng)
        rows = [0, *accepted]
        compact_cache(self.cache, prefix, [prefix + r for r in rows])
        if self._features is not None:
            self._features.append(feats[rows])
        return Verdict(accepted=accepted, bonus=bonus, top=top_logps(logits[rows], self.topk, prefix))
