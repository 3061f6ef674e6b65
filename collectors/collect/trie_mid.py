"""The mid drafter for the all-schedules replay: one forward per distinct tree path per round start.

At a round start the schedule prefixes grow different trees, but most of their nodes are the same
draft: a node's mid log-prob row depends only on the committed context and the node's token path
from the root (its tokens and positions), not on which branch holds it. On the replay's prompts the
branches forward about 3x more nodes than there are distinct paths. ``RoundTrie`` keeps every path
any branch has forwarded at this round start, with its row and its KV, in one cache (committed
context, then the trie's nodes in the order they were first forwarded); a mid call forwards only
the paths no branch has forwarded yet, in one single-sequence forward whose mask lets each node see
the context and its own ancestors, as ``decoder.core.mid.MidDrafter`` does. Each branch then gets the
rows of its own unseen nodes, and is charged for all of them (``pending``): the counts are those of
a real decoder, which has no other branches to borrow from. The rows equal ``batch_rescore``'s up to
float rounding (tests/test_trie_mid.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from collectors.collect.branch_mid import KV, BranchMid
from decoder.core.tensors import QueryBlock, forward_block
from decoder.core.tree import DraftTree


@dataclass
class TrieBranchMid(BranchMid):
    """A branch's mid state whose fed nodes are also nodes of the round's trie (``trie_node``)."""

    trie_node: dict[int, int] = field(default_factory=dict)  # tree node -> trie node

    def copy(self) -> TrieBranchMid:
        return TrieBranchMid(self.scores.copy(), None, 0, dict(self.trie_node))


class RoundTrie:
    """Every token path forwarded by the mid drafter at one round start, with its row and KV."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, context: KV, n_context: int) -> None:
        self.model, self.vocab_size = model, vocab_size
        self.context, self.n_context = context, n_context
        self.cache: DynamicCache | None = None  # built at the first forward
        self.child: dict[tuple[int, int], int] = {}  # (parent trie node or -1, token) -> trie node
        self.ancestors: list[list[int]] = []  # trie node -> its ancestors and itself
        self.depth: list[int] = []
        self.rows: torch.Tensor | None = None  # [n_trie, V] log-probs

    def __len__(self) -> int:
        return len(self.depth)

    def rescore(self, branches: list[tuple[DraftTree, TrieBranchMid]]) -> None:
        """Give every branch the rows of its unseen live nodes, forwarding the new paths once."""
        n_old = len(self)
        tokens: list[int] = []
        work = []
        for tree, bm in branches:
            if not isinstance(bm, TrieBranchMid):
                raise TypeError(f"RoundTrie.rescore needs TrieBranchMid branches, got {type(bm).__name__}")
            new = bm.scores.unseen(tree)  # index order: a parent comes before its children
            for v in new:
                parent = tree.parents[v]
                key = (bm.trie_node[parent] if parent >= 0 else -1, tree.tokens[v])
                node = self.child.get(key)
                if node is None:
                    node = len(self.depth)
                    self.child[key] = node
                    self.depth.append(tree.depths[v])
                    self.ancestors.append([*self.ancestors[key[0]], node] if key[0] >= 0 else [node])
                    tokens.append(tree.tokens[v])
                bm.trie_node[v] = node
            work.append((bm, new))
        if tokens:
            self._forward(n_old, tokens)
        for bm, new in work:
            if new:
                assert self.rows is not None
                index = torch.tensor([bm.trie_node[v] for v in new], device=self.rows.device)
                bm.scores.record(new, self.rows[index])
            bm.pending = len(new)

    def _forward(self, n_old: int, tokens: list[int]) -> None:
        if self.cache is None:
            self.cache = DynamicCache()
            for i, (keys, values) in enumerate(self.context):
                self.cache.update(keys, values, i)
        q = len(tokens)
        visible = np.zeros((q, n_old + q), dtype=bool)
        for i in range(q):
            visible[i, self.ancestors[n_old + i]] = True
        block = QueryBlock(
            tokens=tokens,
            positions=self.n_context + np.asarray(self.depth[n_old:], dtype=np.int64),
            visible=visible,
            prefix_len=self.n_context,
        )
        logits = forward_block(self.model, self.cache, block)[:, : self.vocab_size]
        logp = torch.log_softmax(logits, dim=-1)
        self.rows = logp if self.rows is None else torch.cat([self.rows, logp])
