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

from decoder.core.tensors import QueryBlock, causal_block, compact_cache, crop_cache, forward_block
from decoder.core.tree import DraftTree

# Catch-up tokens up to this many share the tree nodes' forward; longer ones run on their own.
MERGE_CATCH_UP = 64
# Rows are kept raw and normalized when read (TreeScores.record_logits) from this vocabulary size
# on, or whenever the model is not fp32. Below it, one batched log_softmax of all fed rows costs
# less than the per-read batches (measured on the zoo's 2048-token mids: lazy rows lost 0.02 ms
# per call at 8 nodes), and fp32 rows cost no extra memory.
LAZY_ROWS_VOCAB = 16384


@dataclass(frozen=True)
class MidCall:
    """What one mid-drafter call forwarded."""

    n_catch_up: int
    n_tree_nodes: int


class RowStore:
    """Next-token rows of fed tree nodes, shared by TreeScores copies: raw logits until first read.

    A row read for the first time becomes an fp32 log-prob row: in place when the rows are fp32
    (no second copy), else in a side tensor (a bf16 model's rows stay bf16 until read). Adding
    rows builds a new store (`extended`); normalizing mutates this one, and since it is
    deterministic every holder sees the same rows.
    """

    def __init__(self, raw: torch.Tensor, slot: np.ndarray, n_raw: int) -> None:
        self.raw = raw  # [n, V] as recorded
        self.slot = slot  # int64 [n]: the row's index in `logp`, -1 while it is raw
        self.n_raw = n_raw  # rows still raw
        self.logp: torch.Tensor | None = raw if raw.dtype == torch.float32 else None

    def extended(self, rows: torch.Tensor, done: bool) -> RowStore:
        if rows.dtype != self.raw.dtype:
            raise ValueError(f"rows of dtype {rows.dtype} added to a store of {self.raw.dtype} rows")
        n = self.raw.shape[0]
        new = np.arange(n, n + rows.shape[0]) if done else np.full(rows.shape[0], -1)
        n_raw = self.n_raw + (0 if done else rows.shape[0])
        store = RowStore(torch.cat([self.raw, rows]), np.concatenate([self.slot, new]), n_raw)
        if store.logp is None:  # side tensor: the normalized rows carry over as they are
            store.logp = self.logp
        return store

    def slots(self, rows: list[int]) -> list[int]:
        """Index in `logp` of each row; rows read for the first time are normalized in one batch.
        fp32 rows are normalized in place, so there a row's index is the row itself."""
        if self.n_raw:
            slot = self.slot
            pending = [r for r in dict.fromkeys(rows) if slot[r] < 0]
            if pending:
                self._normalize(pending)
        return rows if self.logp is self.raw else self.slot[rows].tolist()

    @torch.inference_mode()
    def _normalize(self, pending: list[int]) -> None:
        idx = torch.tensor(pending, dtype=torch.long, device=self.raw.device)
        logp = torch.log_softmax(self.raw.index_select(0, idx).float(), dim=-1)
        if self.logp is self.raw:
            self.raw.index_copy_(0, idx, logp)
            self.slot[pending] = pending
        else:
            base = 0 if self.logp is None else self.logp.shape[0]
            self.logp = logp if self.logp is None else torch.cat([self.logp, logp])
            self.slot[pending] = np.arange(base, base + len(pending))
        self.n_raw -= len(pending)


class TreeScores:
    """The mid drafter's next-token rows for the tree nodes it has fed this round.

    `record` takes fp32 log-prob rows. `record_logits` keeps a row as the model returned it (raw
    logits); it becomes an fp32 log-prob row the first time something reads it (an edge under that
    node, its top-m children). Most fed nodes are leaves whose row is never read, so with a large
    vocabulary most of the log-softmax work never happens. log_softmax is row-wise, so a row
    normalized alone is bit-identical to that row of the batched log_softmax of `.float()` logits.
    """

    def __init__(self) -> None:
        self.fed: list[int] = []  # nodes in the order they were forwarded
        self.row: dict[int, int] = {}  # node -> row (its index in `fed`)
        self.store: RowStore | None = None

    def copy(self) -> TreeScores:
        """Independent bookkeeping; the row store is shared (adding rows replaces it)."""
        new = TreeScores()
        new.fed, new.row, new.store = self.fed.copy(), self.row.copy(), self.store
        return new

    def unseen(self, tree: DraftTree) -> list[int]:
        return [v for v in tree.live_nodes() if v not in self.row]

    def record(self, nodes: list[int], logp: torch.Tensor) -> None:
        """fp32 log-prob rows [len(nodes), V] of newly fed nodes."""
        self._add(nodes, logp.float(), done=True)

    def record_logits(self, nodes: list[int], logits: torch.Tensor) -> None:
        """Raw next-token logits [len(nodes), V] of newly fed nodes (normalized when read)."""
        self._add(nodes, logits, done=False)

    def _add(self, nodes: list[int], rows: torch.Tensor, done: bool) -> None:
        if rows.shape[0] != len(nodes):
            raise ValueError(f"{rows.shape[0]} rows for {len(nodes)} nodes")
        if self.store is None:
            slot = np.arange(len(nodes)) if done else np.full(len(nodes), -1)
            self.store = RowStore(rows, slot, 0 if done else len(nodes))
        else:
            self.store = self.store.extended(rows, done)
        base = len(self.fed)
        self.row.update((v, base + i) for i, v in enumerate(nodes))
        self.fed.extend(nodes)

    def _logp_rows(self, rows: list[int]) -> tuple[torch.Tensor, list[int]]:
        """The fp32 log-prob tensor and the index in it of each given row."""
        assert self.store is not None
        slots = self.store.slots(rows)
        assert self.store.logp is not None
        return self.store.logp, slots

    @property
    def logp(self) -> torch.Tensor | None:
        """[n_fed, V] fp32 log-prob rows in `fed` order (all of them normalized now), or None."""
        if not self.fed:
            return None
        logp, slots = self._logp_rows(list(range(len(self.fed))))
        return logp[torch.tensor(slots, dtype=torch.long, device=logp.device)]

    def apply_edges(self, tree: DraftTree) -> None:
        """Every live node's edge log-prob becomes the mid's; path scores are refreshed.

        Only the parents' rows are read; one gather over them (flat index slot * V + token).
        """
        if not self.fed:
            return
        nodes = [v for v, ok in enumerate(tree.alive) if ok and v]
        if not nodes:
            return
        row, parents, tokens = self.row, tree.parents, tree.tokens
        logp, slots = self._logp_rows([row[parents[v]] for v in nodes])
        width = logp.shape[1]
        flat = [s * width + tokens[v] for s, v in zip(slots, nodes, strict=True)]
        tree.set_edge_logps(nodes, gather_flat(logp, flat))

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        """Top-m next tokens and their log-probs after each node (nodes must have been fed)."""
        if not nodes:
            return [], []
        logp, slots = self._logp_rows([self.row[v] for v in nodes])
        picked = logp.index_select(0, torch.tensor(slots, dtype=torch.long, device=logp.device))
        vals, ids = torch.topk(picked, k=min(m, picked.shape[1]), dim=-1)
        return ids.tolist(), vals.tolist()


def gather_flat(rows: torch.Tensor, flat: list[int]) -> list[float]:
    """rows.view(-1)[flat] as Python floats; a host tensor is read through NumPy (no index tensor)."""
    if rows.device.type == "cpu" and rows.is_contiguous():
        return rows.numpy().reshape(-1)[flat].tolist()
    return rows.reshape(-1)[torch.tensor(flat, dtype=torch.long, device=rows.device)].tolist()


# Below this many new nodes a Python walk up each node's path builds the mask faster than the
# level-by-level array operations, whose fixed cost per level dominates a small block (random
# trees: 8 nodes 0.006 vs 0.017 ms, 64 nodes 0.032 vs 0.039 ms, 100 nodes 0.050 vs 0.044 ms).
WALK_NODES = 64


def tree_query(tree: DraftTree, fed: list[int], new: list[int], prefix_len: int) -> QueryBlock:
    """New tree nodes on top of `prefix_len` committed tokens and the already fed tree nodes.

    Node i of `new` sees column j of fed + new iff that node is i or one of its ancestors. The mask
    is built from the new nodes' paths only (a walk per node, or for larger blocks one tree level
    at a time for all of them together), never from the whole tree's [n, n] ancestor mask.
    """
    cols = fed + new
    visible = np.zeros((len(new), len(cols)), dtype=bool)
    if len(new) < WALK_NODES:
        col = {v: j for j, v in enumerate(cols)}
        parents, width, flat = tree.parents, len(cols), []
        for i, v in enumerate(new):
            while v >= 0:
                j = col.get(v)
                if j is not None:
                    flat.append(i * width + j)
                v = parents[v]
        visible.reshape(-1)[flat] = True
    else:
        parents_arr = np.asarray(tree.parents, dtype=np.int64)
        col_arr = np.full(len(parents_arr), -1, dtype=np.int64)
        col_arr[cols] = np.arange(len(cols), dtype=np.int64)
        cur = np.asarray(new, dtype=np.int64)
        at = np.arange(len(new))
        while at.size:
            c = col_arr[cur]
            seen = c >= 0
            visible[at[seen], c[seen]] = True
            cur = parents_arr[cur]
            up = cur >= 0
            at, cur = at[up], cur[up]
    depths = tree.depths
    return QueryBlock(
        tokens=[tree.tokens[v] for v in new],
        positions=np.asarray([prefix_len + depths[v] for v in new], dtype=np.int64),
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
        dtype = getattr(model, "dtype", torch.float32)
        self.lazy_rows = vocab_size >= LAZY_ROWS_VOCAB or dtype != torch.float32

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
        block = nodes = tree_query(tree, self.scores.fed, new, self.n_committed + c)
        if c:  # the catch-up tokens lead the block, causal among themselves
            block = QueryBlock(
                tokens=list(catch_up) + nodes.tokens,
                positions=np.concatenate(
                    [np.arange(self.n_committed, self.n_committed + c, dtype=np.int64), nodes.positions]
                ),
                visible=nodes.visible,
                prefix_len=self.n_committed,
                n_causal=c,
            )
        logits = forward_block(self.model, self.cache, block, logits_to_keep=len(new), upcast=False)
        self.n_committed += c
        rows = logits[:, : self.vocab_size]
        if self.lazy_rows:
            self.scores.record_logits(new, rows)
        else:
            self.scores.record(new, torch.log_softmax(rows.float(), dim=-1))

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        return self.scores.top_children(nodes, m)

    def end_round(self, accepted: list[int]) -> None:
        """Keep the KV of the root and the fed part of the accepted path; drop the rest."""
        keep: list[int] = []
        for v in [0, *accepted]:
            if v not in self.scores.row:
                break
            keep.append(self.n_committed + self.scores.row[v])  # its row is its index in `fed`
        if keep:
            compact_cache(self.cache, self.n_committed, keep)
        else:
            crop_cache(self.cache, self.n_committed)
        self.n_committed += len(keep)
        self.scores = TreeScores()
