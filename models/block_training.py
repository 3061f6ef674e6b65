"""Training a block drafter (decoder/graft/drafter.py) on its frozen target, on CPU.

Contract: the target runs once, teacher-forced, over a set of equal-length sequences (its own greedy
continuations of chat prompts and corpus windows), which gives at every position t the features
(hidden states at ``target_layers``, as decoder/graft/block.py defines them) and the target's argmax, its
greedy choice of token t+1. A block rooted at position t sees the features of positions < t and
the root token x[t]; its slot i is labelled with the argmax at t+i, the token at t+i+1 that
speculative decoding must match (on greedy continuations exactly the target's next greedy tokens).
The loss is cross-entropy per slot weighted by exp(-i / gamma) (DFlash). Sequences are split into
train and held-out by sequence, and the result reports per-position top-1 agreement on both.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from config.params import BlockDrafterSpec, TrainParams
from decoder.graft.drafter import BlockDrafterConfig, BlockDrafterNet, context_slots, spread_layers
from models.lm_training import greedy_continuations, param_count, sample_windows, train_loop


@dataclass(frozen=True)
class TargetTrace:
    """A teacher-forced target forward over [N, T] sequences."""

    tokens: torch.Tensor  # [N, T] int64
    features: torch.Tensor  # [N, T, len(target_layers) * hidden] float32
    argmax: torch.Tensor  # [N, T] int64: the target's greedy token for position t + 1

    def split(self, n_held_out: int) -> tuple[TargetTrace, TargetTrace]:
        """(train, held-out): the last ``n_held_out`` sequences are held out."""
        if not 0 < n_held_out < len(self.tokens):
            raise ValueError(f"held-out sequences must be in 1..{len(self.tokens) - 1}, got {n_held_out}")
        cut = len(self.tokens) - n_held_out
        parts = [(f[:cut], f[cut:]) for f in (self.tokens, self.features, self.argmax)]
        return TargetTrace(*(p[0] for p in parts)), TargetTrace(*(p[1] for p in parts))


@torch.no_grad()
def trace_target(
    target: PreTrainedModel, seqs: torch.Tensor, target_layers: tuple[int, ...], batch: int = 16
) -> TargetTrace:
    """Features and argmax of ``target`` at every position of ``seqs`` [N, T]."""
    target.eval()
    feats, argmax = [], []
    for chunk in seqs.split(batch):
        out = target(input_ids=chunk, output_hidden_states=True)
        feats.append(torch.cat([out.hidden_states[i] for i in target_layers], dim=-1).float())
        argmax.append(out.logits.argmax(-1))
    return TargetTrace(seqs, torch.cat(feats), torch.cat(argmax))


def anchors(trace: TargetTrace, k: int) -> torch.Tensor:
    """[A, K] flat label positions (n * T + t + i) of every block that has K labels."""
    n, t = trace.tokens.shape
    if t < k:
        raise ValueError(f"sequences of {t} tokens are shorter than the block K={k}")
    roots = (torch.arange(n)[:, None] * t + torch.arange(t - k + 1)[None, :]).reshape(-1)
    return roots[:, None] + torch.arange(k)[None, :]


def block_inputs(trace: TargetTrace, batch: torch.Tensor, context: int) -> tuple[torch.Tensor, ...]:
    """(feats [B, c, F], valid [B, c], roots [B], labels [B, K]) for label positions ``batch`` [B, K]."""
    t = trace.tokens.shape[1]
    seq, pos = batch[:, 0] // t, batch[:, 0] % t
    rows, valid = context_slots(pos, context)
    feats = trace.features[seq[:, None], rows]
    return feats, valid, trace.tokens[seq, pos], trace.argmax.reshape(-1)[batch]


def position_weights(k: int, gamma: float) -> torch.Tensor:
    """exp(-(k - 1) / gamma) for k = 1..K: the first positions matter most to acceptance."""
    return torch.exp(-torch.arange(k, dtype=torch.float32) / gamma)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted cross-entropy; logits [B, K, V], labels [B, K], weights [K]."""
    ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [B, K]
    return (ce * weights).sum(-1).mean() / weights.sum()


@dataclass(frozen=True)
class Agreement:
    loss: float  # position-weighted cross-entropy
    top1: list[float]  # per position: drafter top-1 == the target's argmax


@torch.no_grad()
def agreement(net: BlockDrafterNet, trace: TargetTrace, gamma: float, batch: int = 512) -> Agreement:
    """Loss and per-position top-1 agreement over every block of ``trace``."""
    net.eval()
    weights = position_weights(net.cfg.k, gamma)
    loss, hits, n = 0.0, torch.zeros(net.cfg.k), 0
    for chunk in anchors(trace, net.cfg.k).split(batch):
        feats, valid, roots, labels = block_inputs(trace, chunk, net.cfg.context)
        logits = net(feats, valid, roots)
        loss += float(block_loss(logits, labels, weights)) * len(chunk)
        hits += (logits.argmax(-1) == labels).sum(0).float()
        n += len(chunk)
    return Agreement(loss / n, (hits / n).tolist())


@dataclass(frozen=True)
class BlockTrainResult:
    net: BlockDrafterNet
    seconds: float  # drafter optimisation only
    final_loss: float  # training-loss EMA at the end
    before: Agreement  # held-out, at initialisation
    train: Agreement
    held_out: Agreement


def train_block_drafter(
    target: PreTrainedModel,
    cfg: BlockDrafterConfig,
    train_trace: TargetTrace,
    held_out: TargetTrace,
    steps: int,
    train: TrainParams,
    gamma: float,
) -> BlockTrainResult:
    """Fit a fresh drafter on blocks of ``train_trace`` (seed it before calling); ``train`` gives
    batch size, lr and warm-up to models.lm_training.train_loop."""
    target.requires_grad_(False)
    net = BlockDrafterNet(cfg)
    net.attach(target)
    before = agreement(net, held_out, gamma)
    pool = anchors(train_trace, cfg.k)
    weights = position_weights(cfg.k, gamma)
    gen = torch.Generator().manual_seed(int(torch.initial_seed()) % (1 << 63))

    def next_batch(_: int) -> torch.Tensor:
        return pool[torch.randint(0, len(pool), (train.batch_size,), generator=gen)]

    def loss_fn(model: BlockDrafterNet, batch: torch.Tensor) -> torch.Tensor:
        feats, valid, roots, labels = block_inputs(train_trace, batch, cfg.context)
        return block_loss(model(feats, valid, roots), labels, weights)

    res = train_loop(net, next_batch, loss_fn, steps, train, f"block drafter k={cfg.k}")
    return BlockTrainResult(
        net.eval(),
        res.seconds,
        res.final_loss,
        before,
        agreement(net, train_trace, gamma),
        agreement(net, held_out, gamma),
    )


def block_sequences(
    generator: PreTrainedModel, prompts: torch.Tensor, tokens: np.ndarray, spec: BlockDrafterSpec, seed: int
) -> torch.Tensor:
    """[sequences, prompt + new_tokens] shuffled: half the target's greedy continuations of chat
    prompts (``generator`` computes the target's function), half corpus windows of that length."""
    rng = np.random.default_rng(seed)
    n_gen = spec.sequences // 2
    idx = torch.from_numpy(rng.permutation(len(prompts))[:n_gen])
    gen = greedy_continuations(generator, prompts[idx], spec.new_tokens, batch=32)
    windows = sample_windows(tokens, spec.sequences - len(gen), gen.size(1), rng)
    seqs = torch.cat([gen, windows])
    return seqs[torch.from_numpy(rng.permutation(len(seqs)))]


def fit_block_drafter(
    spec: BlockDrafterSpec,
    target: PreTrainedModel,
    generator: PreTrainedModel,
    prompts: torch.Tensor,
    tokens: np.ndarray,
    train: TrainParams,
    seed: int,
) -> tuple[BlockDrafterNet, dict]:
    """The zoo's recipe: sequences, one target trace, a split, training; returns (net, manifest info)."""
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    seqs = block_sequences(generator, prompts, tokens, spec, seed)
    gen_s = time.perf_counter() - t0
    tc = target.config
    cfg = BlockDrafterConfig(
        k=spec.k, target_layers=spread_layers(tc.num_hidden_layers, spec.target_layers), context=spec.context,
        layers=spec.layers, d_model=spec.d_model, heads=spec.heads, ffn=spec.ffn,
        target_hidden=tc.hidden_size, vocab_size=tc.vocab_size,
    )  # fmt: skip
    t1 = time.perf_counter()
    train_trace, held_out = trace_target(target, seqs, cfg.target_layers).split(spec.held_out)
    trace_s = time.perf_counter() - t1
    per_spec = train.model_copy(update={"batch_size": spec.batch_size, "lr": spec.lr})
    res = train_block_drafter(target, cfg, train_trace, held_out, spec.steps, per_spec, spec.gamma)
    info = {
        "target": spec.target,
        "k": cfg.k,
        "target_layers": list(cfg.target_layers),
        "params": param_count(res.net),
        "seconds": gen_s + trace_s + res.seconds,
        "sequences_s": gen_s,
        "trace_s": trace_s,
        "train_s": res.seconds,
        "loss": res.final_loss,
        "held_out_loss_before": res.before.loss,
        "held_out_loss": res.held_out.loss,
        "train_top1": res.train.top1,
        "held_out_top1": res.held_out.top1,
        "held_out_top1_before": res.before.top1,
    }
    if not all(math.isfinite(v) for v in (res.final_loss, res.held_out.loss)):
        raise FloatingPointError(f"block drafter for {spec.target}: non-finite loss {info}")
    return res.net, info
