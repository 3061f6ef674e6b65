"""Stand-in block proposers: the `BlockProposer` contract served by models that are not block drafters.

`CausalLMProposer` runs a stock HF causal LM (e.g. the pair's mid drafter) K greedy steps from the
root and returns its top-m next-token log-probs at each step. It is NOT a block drafter: it needs K
sequential forwards (a block drafter needs one), reads no target features, and its marginal at
step d is conditioned on its own greedy tokens 1..d-1 rather than independent of them. It lets the
DDTree path run, and be tested for losslessness, on any pair with a second model.

Its KV cache holds a prefix of committed context plus its last greedy chain; each call keeps the
longest prefix that still agrees with the committed text (the accepted part of the chain included)
and feeds only the rest.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from decoder.core.tensors import causal_block, crop_cache, forward_block
from decoder.graft.block import Marginals


class CausalLMProposer:
    """K greedy steps of a causal LM; its top-m log-probs per step as marginals."""

    target_layers: tuple[int, ...] = ()

    def __init__(self, model: torch.nn.Module, vocab_size: int, k: int = 8) -> None:
        if k <= 0:
            raise ValueError(f"CausalLMProposer: k must be positive, got {k}")
        self.model = model
        self.vocab_size = vocab_size
        self.k = k
        self.cache = DynamicCache()
        self.cached: list[int] = []  # the tokens whose KV the cache holds, in order

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Append tokens to the cache; the fp32 log-probs after the last one, [V]."""
        start = len(self.cached)
        logits = forward_block(self.model, self.cache, causal_block(tokens, start, start), logits_to_keep=1)
        self.cached.extend(tokens)
        return torch.log_softmax(logits[-1, : self.vocab_size], dim=-1)

    def _rewind(self, committed: list[int]) -> None:
        """Keep the longest cached prefix that agrees with committed text, leaving the root unfed."""
        n = 0
        limit = min(len(self.cached), len(committed) - 1)
        while n < limit and self.cached[n] == committed[n]:
            n += 1
        crop_cache(self.cache, n)
        del self.cached[n:]

    def propose(self, features: torch.Tensor | None, committed: list[int], topk: int) -> Marginals:
        """Top-`topk` marginals for the K positions after committed[-1]; features are not read."""
        if not committed:
            raise ValueError("CausalLMProposer.propose: committed must hold at least the root")
        m = min(topk, self.vocab_size)
        self._rewind(committed)
        logp = self._feed(committed[len(self.cached) :])
        ids, vals = [], []
        for d in range(self.k):
            top, idx = torch.topk(logp, k=m)
            ids.append(idx)
            vals.append(top)
            if d + 1 < self.k:
                logp = self._feed([int(idx[0])])
        return Marginals(
            ids=torch.stack(ids).cpu().numpy().astype(np.int64),
            logps=torch.stack(vals).double().cpu().numpy(),
        )
