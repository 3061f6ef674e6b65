"""The mid drafter for replay: per-branch state and one batched forward for many branches.

At a round start, every schedule prefix that calls the mid drafter at step k is a branch with its
own tree and its own fed tree nodes. `batch_rescore` runs all of their unseen nodes in ONE
forward: the cache holds the committed context once, then each branch's fed-node KV, and the mask
lets each branch see only the context and its own ancestors. The result per branch equals what
`decoder.core.mid.MidDrafter.rescore` computes for that branch alone (up to float rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from decoder.core.mid import MidCall, TreeScores, tree_query
from decoder.core.tree import DraftTree

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, n, dim]


@dataclass
class BranchMid:
    """One branch's mid state: log-prob rows and KV of the tree nodes it has fed."""

    scores: TreeScores
    kv: KV | None = None
    pending: int = 0  # nodes the last batch forwarded for this branch

    def copy(self) -> BranchMid:
        return BranchMid(self.scores.copy(), self.kv, 0)

    def rescore(self, tree: DraftTree, committed: list[int]) -> MidCall:
        """The forward already ran in `batch_rescore`; apply the edges and report its size."""
        self.scores.apply_edges(tree)
        return MidCall(n_catch_up=0, n_tree_nodes=self.pending)

    def top_children(self, nodes: list[int], m: int) -> tuple[list[list[int]], list[list[float]]]:
        return self.scores.top_children(nodes, m)


def committed_kv(cache: DynamicCache, length: int) -> KV:
    return [(layer.keys[..., :length, :], layer.values[..., :length, :]) for layer in cache.layers]


@torch.inference_mode()
def batch_rescore(
    model: torch.nn.Module,
    vocab_size: int,
    context: KV,
    n_context: int,
    branches: list[tuple[DraftTree, BranchMid]],
) -> None:
    """Forward every branch's unseen live nodes in one batched pass; record their rows and KV.

    Batch element b holds [context | branch b's fed nodes, padded | its new nodes, padded]; padding
    is masked out, so each element computes exactly its own branch.
    """
    work = [(tree, bm, bm.scores.unseen(tree)) for tree, bm in branches]
    work = [w for w in work if w[2]]
    if not work:
        return
    n_batch = len(work)
    f_max = max(len(bm.scores.fed) for _, bm, _ in work)
    q_max = max(len(new) for _, _, new in work)
    ids = np.zeros((n_batch, q_max), dtype=np.int64)
    pos = np.full((n_batch, q_max), n_context, dtype=np.int64)
    visible = np.zeros((n_batch, q_max, n_context + f_max + q_max), dtype=bool)
    visible[:, :, :n_context] = True
    for b, (tree, bm, new) in enumerate(work):
        block = tree_query(tree, bm.scores.fed, new, n_context)
        f, q = len(bm.scores.fed), len(new)
        ids[b, :q], pos[b, :q] = block.tokens, block.positions
        visible[b, :q, n_context : n_context + f] = block.visible[:, :f]
        visible[b, :q, n_context + f_max : n_context + f_max + q] = block.visible[:, f:]
    cache = _batched_cache(context, [bm.kv for _, bm, _ in work], f_max)
    device, dtype = model.device, model.dtype
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(
        torch.from_numpy(~visible), torch.finfo(dtype).min
    )
    out = model(
        input_ids=torch.from_numpy(ids).to(device),
        position_ids=torch.from_numpy(pos).to(device),
        attention_mask=mask[:, None].to(device),
        cache=cache,
        use_cache=True,
    )
    logp = torch.log_softmax(out.logits[..., :vocab_size].float(), dim=-1)
    start = n_context + f_max
    for b, (_, bm, new) in enumerate(work):
        q = len(new)
        bm.scores.record(new, logp[b, :q])
        rows = [
            (lay.keys[b : b + 1, :, start : start + q], lay.values[b : b + 1, :, start : start + q])
            for lay in cache.layers
        ]
        bm.kv = (
            rows
            if bm.kv is None
            else [
                (torch.cat([a, c], -2), torch.cat([d, e], -2))
                for (a, d), (c, e) in zip(bm.kv, rows, strict=True)
            ]
        )
        bm.pending = q


def _batched_cache(context: KV, fed: list[KV | None], f_max: int) -> DynamicCache:
    """[B, heads, context + f_max, dim] per layer: shared context, then each branch's fed KV, padded."""
    cache = DynamicCache()
    n_batch = len(fed)
    for i, (k_ctx, v_ctx) in enumerate(context):
        shape = (n_batch, k_ctx.shape[1], k_ctx.shape[2] + f_max, k_ctx.shape[3])
        keys = k_ctx.new_zeros(shape)
        values = v_ctx.new_zeros((n_batch, v_ctx.shape[1], v_ctx.shape[2] + f_max, v_ctx.shape[3]))
        keys[:, :, : k_ctx.shape[2]] = k_ctx
        values[:, :, : v_ctx.shape[2]] = v_ctx
        for b, kv in enumerate(fed):
            if kv:
                f = kv[i][0].shape[2]
                keys[b, :, k_ctx.shape[2] : k_ctx.shape[2] + f] = kv[i][0][0]
                values[b, :, v_ctx.shape[2] : v_ctx.shape[2] + f] = kv[i][1][0]
        cache.update(keys, values, i)
    return cache
