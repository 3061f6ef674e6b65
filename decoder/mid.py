"""The mid drafter: any stock HF causal LM sharing the target's tokenizer.

Contract:
- Its KV cache holds a prefix of the committed context. It catches up lazily: the first call of a
  round feeds the missing committed tokens (except the root) together with the tree.
- One call (`rescore`) is one forward over the tree nodes it has not seen this round, with an
  ancestor mask and explicit position_ids, on top of the cached context and the tree nodes it fed
  earlier in the round (their KV is reused). Afterwards every live node's edge log-prob is the
  mid drafter's own, and path scores are refreshed.
- `end_round` keeps the KV of the committed part of the tree (root + accepted path) and drops the
  rest, so the next round only catches up on what it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from decoder.tensors import QueryBlock, causal_block, compact_cache, crop_cache, forward_block
from decoder.tree import DraftTree

# Catch-up tokens up to this many share the tree nodes' forward; longer ones run on their own.
MERGE_CATCH_UP = 64


@dataclass(frozen=True)
class MidCall:
    """What one mid-drafter call forwarded."""

    n_catch_up: int
    n_tree_nodes: int


class TreeScores:
    """The mid drafter's next-token log-prob rows for the tree nodes it has fed this round."""

    def __init__(self) -> None:
        self.fed: list[int] = []  # nodes in the order they were forwarded
        self.row: dict[int, int] = {}  # node -> row of logp
        self.logp: torch.Tensor | None = None  # [n_fed, V]

    def copy(self) -> TreeScores:
        """Independent bookkeeping; the rows tensor is shared (it is only ever replaced)."""
        new = TreeScores()
        new.fed, new.row, new.logp = self.fed.copy(), self.row.copy(), self.logp
        return new

    def unseen(self, tree: DraftTree) -> list[int]:
        return [v for v in tree.live_nodes() if v not in self.row]

    def record(self, nodes: list[int], logp: torch.Tensor) -> None:
        base = 0 if self.logp is None else self.logp.shape[0]
        self.logp = logp if self.logp is None else torch.cat([self.logp, logp])
        for i, v in enumerate(nodes):
            self.row[v] = base + i
        self.fed.extend(nodes)

    def apply_edges(self, tree: DraftTree) -> None:
        """Every live node's edge log-prob becomes the mid's; path scores are refreshed.

        One gather over the flattened rows (flat index row(parent) * V + token), no per-node tensor.
        """
        if self.logp is None:
            return
        nodes = [v for v, ok in enumerate(tree.alive) if ok and v]
        if not nodes:
            return
        row, parents, tokens, width = self.row, tree.parents, tree.tokens, self.logp.shape[1]
        flat = [row[parents[v]] * width + tokens[v] for v in nodes]
        tree.set_edge_logps(nodes, gather_flat(self.logp, flat))

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        """Top-m next tokens and their log-probs after each node (nodes must have been fed)."""
        if not nodes:
            return [], []
        assert self.logp is not None
        picked = self.logp[[self.row[v] for v in nodes]]
        vals, ids = torch.topk(picked, k=min(m, self.logp.shape[1]), dim=-1)
        return ids.tolist(), vals.tolist()


def gather_flat(rows: torch.Tensor, flat: list[int]) -> list[float]:
    """rows.view(-1)[flat] as Python floats; a host tensor is read through NumPy (no index tensor)."""
    if rows.device.type == "cpu" and rows.is_contiguous():
        return rows.numpy().reshape(-1)[flat].tolist()
    return rows.reshape(-1)[torch.tensor(flat, dtype=torch.long, device=rows.device)].tolist()


def tree_query(tree: DraftTree, fed: list[int], new: list[int], prefix_len: int) -> QueryBlock:
    """New tree nodes on top of `prefix_len` committed tokens and the already fed tree nodes.

    Node i of `new` sees column j of fed + new iff that node is i or one of its ancestors. Built
    one tree level at a time (all new nodes step to their parents together): O(depth) array
    operations, never the whole tree's [n, n] ancestor mask.
    """
    cols = fed + new
    parents = np.asarray(tree.parents, dtype=np.int64)
    col = np.full(len(parents), -1, dtype=np.int64)
    col[cols] = np.arange(len(cols), dtype=np.int64)
    cur = np.asarray(new, dtype=np.int64)
    visible = np.zeros((len(new), len(cols)), dtype=bool)
    at = np.arange(len(new))
    while at.size:
        c = col[cur]
        seen = c >= 0
        visible[at[seen], c[seen]] = True
        cur = parents[cur]
        up = cur >= 0
        at, cur = at[up], cur[up]
    return QueryBlock(
        tokens=[tree.tokens[v] for v in new],
        positions=prefix_len + np.asarray(tree.depths, dtype=np.int64)[np.asarray(new, dtype=np.int64)],
        visible=visible,
        prefix_len=prefix_len,
    )


class MidDrafter:
    """Re-scores a draft tree and proposes top-m children with a neural LM."""

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.cache = DynamicCache()
        self.n_committed = 0  # committed tokens in the cache
        self.scores = TreeScores()

    def rescore(self, tree: DraftTree, committed: list[int]) -> MidCall:
        """Forward unseen live nodes; set every live node's edge log-prob to the mid's."""
        prefix = len(committed) - 1  # the root (last committed token) is tree node 0
        if self.n_committed > prefix:
            raise RuntimeError("mid cache holds more committed tokens than exist")
        catch_up = committed[self.n_committed : prefix] if not self.scores.fed else []
        new = self.scores.unseen(tree)
        if new or catch_up:
            self._forward(tree, catch_up, new)
        self.scores.apply_edges(tree)
        return MidCall(n_catch_up=len(catch_up), n_tree_nodes=len(new))

    def _forward(self, tree: DraftTree, catch_up: list[int], new: list[int]) -> None:
        """One forward: catch-up tokens (causal) then the new tree nodes (ancestor mask).

        A long catch-up (the prompt, in the first round) runs on its own as a plain causal block (the
        model's own causal mask, no [q, q] mask from the host); only the new nodes' logits are
        computed.
        """
        c = len(catch_up)
        if c and (c > MERGE_CATCH_UP or not new):
            start = self.n_committed
            forward_block(self.model, self.cache, causal_block(catch_up, start, start), logits_to_keep=1)
            self.n_committed += c
            catch_up, c = [], 0
        if not new:
            return
        nodes = tree_query(tree, self.scores.fed, new, self.n_committed + c)
        block = QueryBlock(
            tokens=list(catch_up) + nodes.tokens,
            positions=np.concatenate(
                [np.arange(self.n_committed, self.n_committed + c, dtype=np.int64), nodes.positions]
            ),
            visible=nodes.visible,
            prefix_len=self.n_committed,
            n_causal=c,
        )
        logits = forward_block(self.model, self.cache, block, logits_to_keep=len(new))[:, : self.vocab_size]
        self.n_committed += c
        self.scores.record(new, torch.log_softmax(logits, dim=-1))

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        return self.scores.top_children(nodes, m)

    def end_round(self, accepted: list[int]) -> None:
        """Keep the KV of the root and the fed part of the accepted path; drop the rest."""
        keep: list[int] = []
        for v in [0, *accepted]:
            if v not in self.scores.row:
                break
            keep.append(self.n_committed + self.scores.fed.index(v))
        if keep:
            compact_cache(self.cache, self.n_committed, keep)
        else:
            crop_cache(self.cache, self.n_committed)
        self.n_committed += len(keep)
        self.scores = TreeScores()
