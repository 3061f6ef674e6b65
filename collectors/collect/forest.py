"""The mid drafter for a batched replay: every round start of one prompt served by one forest.

At temperature 0 every round start of a prompt is a prefix of the same text T (prompt + the
target's greedy continuation), so a tree node's mid row depends only on the tokens before it: the
text up to where its path leaves T (its anchor) and the drafted tokens after that (its tail). Nodes
of different starts, and of different schedules at one start, with the same anchor and tail are the
same context, hence the same row. `MidForest` keeps one node per such context:

- a node on T itself (a root, or a drafted path that spells T so far) takes its row from one causal
  forward over T (`text_rows`), which also gives the KV every drafted node attends to;
- every other node is forwarded once, in batches: all the new nodes of a drafting step, over every
  start of the prompt being grown, in one single-sequence forward whose cache holds T's KV up to
  the deepest anchor and the KV of the batch's earlier drafted ancestors, and whose 4D mask lets
  each node see T up to its anchor and its own drafted ancestors (positions: anchor + tail depth).

Each branch's `ForestScores` maps its tree nodes to forest rows and is charged, like a real
decoder, for every node it has not fed before (`pending`): the counts are a real decoder's; only
the forwards are shared. Rows are fp32 log-probs, so they match the per-start replay
(collectors/collect/trie_mid.py) and the runtime (decoder/core/mid.py) up to float rounding: a
different batch sums attention and matmuls in another order, which may flip a near-tied top-k pick
(tests/test_forest.py classifies every such difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from collectors.collect.branch_mid import KV, BranchMid
from decoder.core.mid import MidCall, gather_flat
from decoder.core.tensors import QueryBlock, causal_block, forward_block
from decoder.core.tree import DraftTree

# Rows forwarded together at most: larger steps are split between starts (a start's new nodes stay
# in one forward, so a node's new ancestors are always in its own forward or an earlier one).
MAX_ROWS = 512
TEXT = -1  # `Node.parent` of a node whose parent is a text position (its anchor)


@dataclass(frozen=True)
class Node:
    """A drafted node of the forest: tail token ``token`` at tail depth ``depth`` after T[anchor]."""

    anchor: int  # last text position of its context
    depth: int  # 1 for the first drafted token after the anchor
    parent: int  # forest id of the parent node, TEXT when the parent is T[anchor]
    token: int


class MidForest:
    """Every mid row of one prompt's replay: T's rows and the drafted nodes of all its starts."""

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        text: Sequence[int],
        first_row: int,
        max_rows: int = MAX_ROWS,
    ) -> None:
        """first_row: the first text position whose row any start reads (the first round's root);
        max_rows: the most drafted nodes one forward carries."""
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.model, self.vocab_size, self.max_rows = model, vocab_size, max_rows
        self.text = [int(t) for t in text]
        self.n_text = len(self.text) - 1  # positions with a KV and a row: T[:-1]
        if not 0 <= first_row < self.n_text:
            raise ValueError(f"first_row {first_row} outside the text's {self.n_text} positions")
        self.first_row = first_row
        self.nodes: list[Node] = []
        self.child: dict[tuple[int, int], int] = {}  # (parent id or TEXT - anchor, token) -> node id
        self.forwards = 0  # batched forwards run (the text forward excluded)
        self.text_kv = DynamicCache()
        logits = forward_block(
            model, self.text_kv, causal_block(self.text[:-1], 0, 0), logits_to_keep=self.n_text - first_row
        )
        self._rows = torch.log_softmax(logits[:, :vocab_size].float(), dim=-1)
        self._n_rows = self._rows.shape[0]
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer [1, heads, n_nodes, dim]

    # -- rows ---------------------------------------------------------------------------------
    def text_row(self, position: int) -> int:
        """Row id of T's position (its next-token row)."""
        return position - self.first_row

    def node_row(self, node: int) -> int:
        return self.n_text - self.first_row + node

    @property
    def logp(self) -> torch.Tensor:
        """[rows, V] fp32 log-probs: T's rows from ``first_row`` on, then the drafted nodes'."""
        return self._rows[: self._n_rows]

    # -- nodes --------------------------------------------------------------------------------
    def root(self, start: int) -> int:
        """Row id of the root of a round starting after ``start`` committed tokens."""
        return self.text_row(start - 1)

    def child_row(self, parent_row: int, token: int) -> tuple[int, bool]:
        """(row id of ``token`` drafted after the node of ``parent_row``, whether it is a new node
        to forward). A child that continues T stays on the text while T has a row there."""
        n_text_rows = self.n_text - self.first_row
        if parent_row < n_text_rows:
            position = self.first_row + parent_row
            if position + 1 < self.n_text and self.text[position + 1] == token:
                return self.text_row(position + 1), False
            key, anchor, depth, parent = (TEXT - position, token), position, 1, TEXT
        else:
            node = parent_row - n_text_rows
            up = self.nodes[node]
            key, anchor, depth, parent = (node, token), up.anchor, up.depth + 1, node
        found = self.child.get(key)
        if found is not None:
            return self.node_row(found), False
        self.child[key] = len(self.nodes)
        self.nodes.append(Node(anchor, depth, parent, token))
        return self.node_row(len(self.nodes) - 1), True

    def rescore(self, branches: Sequence[tuple[int, DraftTree, ForestBranchMid]]) -> None:
        """Give every (start, tree, branch) the rows of its unseen live nodes; forward the nodes no
        branch of this forest has forwarded yet, in as few forwards as ``max_rows`` allows."""
        n_old = len(self.nodes)
        for start, tree, bm in branches:
            bm.pending = len(bm.scores.resolve(self, start, tree))
        by_anchor: dict[int, list[int]] = {}  # a new node's new ancestors share its anchor
        for node in range(n_old, len(self.nodes)):
            by_anchor.setdefault(self.nodes[node].anchor, []).append(node)
        batch: list[int] = []
        for anchor in sorted(by_anchor):
            if batch and len(batch) + len(by_anchor[anchor]) > self.max_rows:
                self._forward(batch)
                batch = []
            batch += by_anchor[anchor]
        if batch:
            self._forward(batch)

    def _forward(self, new: list[int]) -> None:
        """One forward of the drafted nodes ``new`` (parents before children)."""
        nodes = self.nodes
        new.sort()  # ids are assigned parents first
        index = {n: i for i, n in enumerate(new)}
        earlier = sorted({a for n in new for a in self._ancestors(n) if a not in index})
        at = {n: i for i, n in enumerate(earlier)}
        deepest = max(nodes[n].anchor for n in new)
        prefix = min(nodes[n].anchor for n in new) + 1  # T's positions every node sees
        n_text, g, q = deepest + 1 - prefix, len(earlier), len(new)
        visible = np.zeros((q, n_text + g + q), dtype=bool)
        for i, n in enumerate(new):
            visible[i, : nodes[n].anchor + 1 - prefix] = True
            for a in self._ancestors(n):
                visible[i, n_text + at[a] if a in at else n_text + g + index[a]] = True
            visible[i, n_text + g + i] = True
        cache = self._cache(deepest + 1, earlier)
        block = QueryBlock(
            tokens=[nodes[n].token for n in new],
            positions=np.asarray([nodes[n].anchor + nodes[n].depth for n in new], dtype=np.int64),
            visible=visible,
            prefix_len=prefix,
        )
        logits = forward_block(self.model, cache, block)[:, : self.vocab_size]
        self._put_rows([self.node_row(n) for n in new], torch.log_softmax(logits, dim=-1))
        self._put_kv(new, [(lay.keys[..., -q:, :], lay.values[..., -q:, :]) for lay in cache.layers])
        self.forwards += 1

    def _ancestors(self, node: int) -> list[int]:
        """The drafted ancestors of a node, nearest first (T's positions excluded)."""
        out, p = [], self.nodes[node].parent
        while p != TEXT:
            out.append(p)
            p = self.nodes[p].parent
        return out

    def _cache(self, n_text: int, earlier: list[int]) -> DynamicCache:
        """T's KV of positions [0, n_text) and the KV of the drafted nodes ``earlier``, in order."""
        cache = DynamicCache()
        idx = torch.tensor(earlier, dtype=torch.long, device=self.model.device) if earlier else None
        for i, layer in enumerate(self.text_kv.layers):
            keys, values = layer.keys[..., :n_text, :], layer.values[..., :n_text, :]
            if idx is not None:
                k_old, v_old = self._kv[i]
                keys = torch.cat([keys, k_old.index_select(2, idx)], dim=2)
                values = torch.cat([values, v_old.index_select(2, idx)], dim=2)
            cache.update(keys, values, i)
        return cache

    def _put_rows(self, rows: list[int], logp: torch.Tensor) -> None:
        """Write the rows of nodes just forwarded (a node's row id is fixed when it is created, and
        the nodes of one step may be forwarded in another order)."""
        need = max(rows) + 1
        if need > self._rows.shape[0]:  # grow by doubling: amortised O(1) copies per row
            grown = self._rows.new_empty((max(need, 2 * self._rows.shape[0]), self._rows.shape[1]))
            grown[: self._n_rows] = self._rows[: self._n_rows]
            self._rows = grown
        self._rows[torch.tensor(rows, dtype=torch.long)] = logp
        self._n_rows = max(self._n_rows, need)

    def _put_kv(self, nodes: list[int], new: KV) -> None:
        """Write the KV of nodes just forwarded at their ids (grown by doubling like the rows)."""
        need = max(nodes) + 1
        have = self._kv[0][0].shape[2] if self._kv else 0
        if need > have:
            size = max(need, 2 * have)
            grown = []
            for i, (k, v) in enumerate(new):
                k_all = k.new_zeros((*k.shape[:2], size, k.shape[3]))
                v_all = v.new_zeros((*v.shape[:2], size, v.shape[3]))
                if have:
                    k_all[:, :, :have] = self._kv[i][0]
                    v_all[:, :, :have] = self._kv[i][1]
                grown.append((k_all, v_all))
            self._kv = grown
        idx = torch.tensor(nodes, dtype=torch.long, device=new[0][0].device)
        for (k_all, v_all), (k, v) in zip(self._kv, new, strict=True):
            k_all.index_copy_(2, idx, k)
            v_all.index_copy_(2, idx, v)


@dataclass
class ForestScores:
    """One branch's mid rows: its fed tree nodes and their forest rows (no rows of its own)."""

    row: dict[int, int] = field(default_factory=dict)  # tree node -> forest row id
    forest: MidForest | None = None

    def copy(self) -> ForestScores:
        return ForestScores(dict(self.row), self.forest)

    def unseen(self, tree: DraftTree) -> list[int]:
        return [v for v in tree.live_nodes() if v not in self.row]

    def resolve(self, forest: MidForest, start: int, tree: DraftTree) -> list[int]:
        """Map the unseen live nodes to forest rows (new forest nodes are created, not yet
        forwarded); return the unseen nodes: what a real decoder would forward now."""
        self.forest = forest
        new = self.unseen(tree)  # index order: a parent comes before its children
        parents, tokens, row = tree.parents, tree.tokens, self.row
        for v in new:
            row[v] = forest.root(start) if parents[v] < 0 else forest.child_row(row[parents[v]], tokens[v])[0]
        return new

    def apply_edges(self, tree: DraftTree) -> None:
        """Every live node's edge log-prob becomes the mid's (as decoder.core.mid.TreeScores)."""
        if not self.row:
            return
        nodes = [v for v, ok in enumerate(tree.alive) if ok and v]
        if not nodes:
            return
        assert self.forest is not None
        logp = self.forest.logp
        width, parents, tokens = logp.shape[1], tree.parents, tree.tokens
        flat = [self.row[parents[v]] * width + tokens[v] for v in nodes]
        tree.set_edge_logps(nodes, gather_flat(logp, flat))

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        if not nodes:
            return [], []
        assert self.forest is not None
        logp = self.forest.logp
        picked = logp.index_select(0, torch.tensor([self.row[v] for v in nodes], dtype=torch.long))
        vals, ids = torch.topk(picked, k=min(m, picked.shape[1]), dim=-1)
        return ids.tolist(), vals.tolist()


@dataclass
class ForestBranchMid(BranchMid):
    """A branch's mid state in a batched replay: its rows live in the prompt's MidForest."""

    scores: ForestScores = field(default_factory=ForestScores)  # type: ignore[assignment]

    def copy(self) -> ForestBranchMid:
        return ForestBranchMid(self.scores.copy(), None, 0)

    def rescore(self, tree: DraftTree, committed: list[int]) -> MidCall:
        """The forward already ran in MidForest.rescore; apply the edges and report its size."""
        self.scores.apply_edges(tree)
        return MidCall(n_catch_up=0, n_tree_nodes=self.pending)
