"""Fitting GRAFT's target-distilled edge scorer (TDES) on collected edges (collectors/graft/edges.py).

Model (design/GRAFT.md): f(p, c, d) = w^T ReLU(W [g_p(e_p); g_c(e_c); e_d] + b) + b0, with e the
target's token embeddings (frozen, shared with the target), g_p and g_c linear projections, e_d a
learned depth embedding, and a learnable scale s = exp(log_s) > 0. The tree ranks siblings by
z = log q_d(c) + s f(p, c, d) (decoder/graft/edge_scorer.py renormalises z over the sibling set).

Loss, on one pair's edges: L = l_KL L_KL + l_pair L_pair + l_BCE L_BCE with
- L_KL: KL(softmax(target logits) || softmax(z)) over the m candidates, per (round, depth) of an
  accepted parent;
- L_pair = softplus(gamma - z(v+) + z(v-)) over every positive v+ and each of its negatives: the
  same child under a wrong (tree, non-accepted) parent of the same round and depth, and every
  competing child under the right parent. On z, the score the tree ranks by (for a wrong parent
  log q cancels and this is GRAFT's f difference);
- L_BCE: binary cross-entropy of f as a logit for the label, positives weighted by w1 (0: the
  training rows' n_neg / n_pos).
Training is full batch (every edge each step; a pair has ~10^5 edges), Adam, ``epochs`` steps.
Token tables are recomputed from the embeddings each step and exported once
(:func:`export_scorer`), so the runtime never projects an embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from config.params import EdgesParams
from decoder.graft.edge_scorer import EdgeScorer


@dataclass(frozen=True)
class EdgeData:
    """One pair's edges as arrays (rows in the collected order), plus the loss index sets."""

    parent: np.ndarray  # (N,) token ids
    child: np.ndarray  # (N,)
    depth: np.ndarray  # (N,) 1..K
    logq: np.ndarray  # (N,)
    label: np.ndarray  # (N,) bool
    kl_rows: np.ndarray  # (G, m) row indices of the sibling sets of accepted parents
    kl_logits: np.ndarray  # (G, m) target logits over those sets
    pairs: np.ndarray  # (P, 2) (positive row, negative row)

    @property
    def n(self) -> int:
        return int(self.parent.shape[0])


def edge_data(edges: pl.DataFrame) -> EdgeData:
    """Arrays and loss index sets of one pair's edges (a frame of the ``edges`` table's columns)."""
    df = edges.with_row_index("row").with_columns(
        pl.concat_str(["dataset_id", "prompt_id", "round_id"], separator="/").alias("round_key")
    )
    m = df.filter(pl.col("depth") == 1).group_by("round_key").len()["len"].unique().to_list()
    if len(m) != 1:
        raise ValueError(f"edges: sibling sets differ in size across rounds ({sorted(m)})")
    acc = df.filter(pl.col("is_accepted_parent")).sort(["round_key", "depth", "child_rank"])
    kl_rows = acc["row"].to_numpy().astype(np.int64).reshape(-1, m[0])
    kl_logits = acc["target_logit"].to_numpy().astype(np.float64).reshape(-1, m[0])
    if not np.all(np.isfinite(kl_logits)):
        raise ValueError("edges: column 'target_logit' is null or not finite on an accepted parent's row")
    pos = df.filter(pl.col("is_target")).select("row", "round_key", "depth", "child_token", "parent_node")
    keys = ["round_key", "depth"]
    wrong = pos.join(df.filter(~pl.col("is_accepted_parent")), on=[*keys, "child_token"], suffix="_neg")
    rival = pos.join(acc, on=keys, suffix="_neg").filter(pl.col("row") != pl.col("row_neg"))
    pairs = pl.concat([wrong.select("row", "row_neg"), rival.select("row", "row_neg")])
    return EdgeData(
        parent=df["parent_token"].to_numpy().astype(np.int64),
        child=df["child_token"].to_numpy().astype(np.int64),
        depth=df["depth"].to_numpy().astype(np.int64),
        logq=df["logq"].to_numpy().astype(np.float64),
        label=df["is_target"].to_numpy().astype(bool),
        kl_rows=kl_rows,
        kl_logits=kl_logits,
        pairs=pairs.to_numpy().astype(np.int64).reshape(-1, 2),
    )


class TDESNet(nn.Module):
    """f(p, c, d) over a frozen embedding table; see the module docstring."""

    def __init__(self, embeddings: torch.Tensor, k: int, cfg: EdgesParams) -> None:
        super().__init__()
        self.register_buffer("emb", embeddings.detach().float().clone())
        width = embeddings.shape[1]
        self.g_p = nn.Linear(width, cfg.proj)
        self.g_c = nn.Linear(width, cfg.proj)
        self.e_d = nn.Embedding(k, cfg.depth_dim)
        self.W = nn.Linear(2 * cfg.proj + cfg.depth_dim, cfg.hidden)
        self.w = nn.Linear(cfg.hidden, 1)
        self.log_s = nn.Parameter(torch.tensor(np.log(0.5), dtype=torch.float32))
        self.proj, self.depth_dim = cfg.proj, cfg.depth_dim

    def tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parent (V, h), child (V, h), depth (K, h)): W's parts applied to each input, b in depth."""
        wp, wc, wd = self.W.weight.split([self.proj, self.proj, self.depth_dim], dim=1)
        return self.g_p(self.emb) @ wp.T, self.g_c(self.emb) @ wc.T, self.e_d.weight @ wd.T + self.W.bias

    def forward(self, parent: torch.Tensor, child: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        tp, tc, td = self.tables()
        return self.w(F.relu(tp[parent] + tc[child] + td[depth - 1])).squeeze(-1)

    @property
    def scale(self) -> torch.Tensor:
        return self.log_s.exp()


def tdes_loss(net: TDESNet, data: dict[str, torch.Tensor], cfg: EdgesParams, w1: float) -> torch.Tensor:
    f = net(data["parent"], data["child"], data["depth"])
    z = data["logq"] + net.scale * f
    loss = torch.zeros((), dtype=f.dtype)
    if data["kl_rows"].numel():
        teacher = F.log_softmax(data["kl_logits"], dim=-1)
        student = F.log_softmax(z[data["kl_rows"]], dim=-1)
        loss = loss + cfg.lambda_kl * F.kl_div(student, teacher, log_target=True, reduction="batchmean")
    if data["pairs"].numel():
        gap = z[data["pairs"][:, 0]] - z[data["pairs"][:, 1]]
        loss = loss + cfg.lambda_pair * F.softplus(cfg.pair_margin - gap).mean()
    weight = torch.where(data["label"] > 0, torch.tensor(w1, dtype=f.dtype), torch.tensor(1.0, dtype=f.dtype))
    bce = F.binary_cross_entropy_with_logits(f, data["label"], weight=weight)
    return loss + cfg.lambda_bce * bce


def _tensors(data: EdgeData) -> dict[str, torch.Tensor]:
    return {
        "parent": torch.from_numpy(data.parent),
        "child": torch.from_numpy(data.child),
        "depth": torch.from_numpy(data.depth),
        "logq": torch.from_numpy(data.logq).float(),
        "label": torch.from_numpy(data.label.astype(np.float32)),
        "kl_rows": torch.from_numpy(data.kl_rows),
        "kl_logits": torch.from_numpy(data.kl_logits).float(),
        "pairs": torch.from_numpy(data.pairs),
    }


@dataclass(frozen=True)
class Fit:
    net: TDESNet
    losses: list[float]  # training loss per step


def fit_tdes(data: EdgeData, embeddings: torch.Tensor, k: int, cfg: EdgesParams, seed: int) -> Fit:
    """Fit f on one pair's edges (full batch, Adam, cfg.epochs steps)."""
    if data.n == 0:
        raise ValueError("fit_tdes: no edges to fit")
    torch.manual_seed(seed)
    net = TDESNet(embeddings, k, cfg)
    n_pos = int(data.label.sum())
    w1 = cfg.w1 if cfg.w1 > 0 else (data.n - n_pos) / max(n_pos, 1)
    tensors = _tensors(data)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    losses = []
    for _ in range(cfg.epochs):
        opt.zero_grad()
        loss = tdes_loss(net, tensors, cfg, w1)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return Fit(net.eval(), losses)


@torch.no_grad()
def export_scorer(net: TDESNet) -> EdgeScorer:
    """The runtime tables of a fitted net (decoder/graft/edge_scorer.py)."""
    tp, tc, td = net.tables()
    return EdgeScorer(
        parent_table=tp.double().numpy(),
        child_table=tc.double().numpy(),
        depth_table=td.double().numpy(),
        w=net.w.weight[0].double().numpy(),
        b0=float(net.w.bias[0]),
        scale=float(net.scale),
    )
