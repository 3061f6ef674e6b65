"""A DFlash-style block drafter: K future positions in one forward, conditioned on the target.

Contract: :class:`BlockDrafterNet` is a plain nn.Module. The target's hidden states at
``target_layers`` for the last ``context`` cached positions (decoder/graft/block.py's *features*) are
projected to the drafter's width and fed to every drafter layer as extra keys and values. The
block's inputs are the root token's embedding followed by K-1 learned mask embeddings; attention is
bidirectional inside the block and the whole context is visible to every block slot. Block slot i
predicts the token at root + i + 1 through the target's own LM head. The embedding and LM head are
the target's, attached at load time and never saved: the files hold only the drafter's weights
(``block_drafter.safetensors``) and its config (``block_drafter.json``), which pins the weights by
SHA-256 and itself by a digest of its other fields, so any edit of either file is refused with the
file and field named. A folder that also holds a ``checkpoint_digest.json`` (the zoo records one)
is checked against it first, as every zoo checkpoint is (decoder/models/checkpoint.py): a file that
differs is refused, named, before anything is parsed. :class:`BlockDrafter` serves it behind
decoder.graft.block.BlockProposer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import nn
from transformers import PreTrainedModel

from decoder.graft.block import Marginals
from decoder.io.files import replace_atomically, sha256_of_file
from decoder.io.json_manifest import canonical_digest, check_field_names, read_json_object
from decoder.models.checkpoint import CheckpointError, verify_folder

SCHEMA_VERSION = "treegraft-block-drafter/1"
CONFIG_NAME = "block_drafter.json"
WEIGHTS_NAME = "block_drafter.safetensors"
WRITER_FIELDS = ("schema_version", "weights_sha256", "config_sha256")


class BlockDrafterError(ValueError):
    """A block drafter's files are missing, edited, or do not fit the target."""


@dataclass(frozen=True)
class BlockDrafterConfig:
    """Shapes of a block drafter and of the target it reads (its hidden size and vocabulary)."""

    k: int  # future positions per forward
    target_layers: tuple[int, ...]  # indices into the target's hidden_states (0 = embeddings)
    context: int  # cached positions of features it attends to (the last c)
    layers: int
    d_model: int
    heads: int
    ffn: int
    target_hidden: int
    vocab_size: int

    @property
    def feature_dim(self) -> int:
        return len(self.target_layers) * self.target_hidden


def spread_layers(num_hidden_layers: int, n: int) -> tuple[int, ...]:
    """``n`` hidden_states indices evenly spaced from the first layer's output to the last."""
    if n < 1 or num_hidden_layers < 1:
        raise ValueError(f"need n >= 1 and a target with layers, got n={n}, layers={num_hidden_layers}")
    if n == 1:
        return (num_hidden_layers,)
    return tuple(sorted({1 + (num_hidden_layers - 1) * j // (n - 1) for j in range(n)}))


def context_slots(root_pos: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature rows each block attends to, right-aligned: slot c-1 is the position before the root.

    root_pos: [B] positions of the roots (= cached rows before them). Returns (rows [B, c] clamped
    to >= 0, valid [B, c] bool), invalid where the context is shorter than c.
    """
    rows = root_pos[:, None] - context + torch.arange(context, device=root_pos.device)[None, :]
    return rows.clamp(min=0), rows >= 0


class _BlockLayer(nn.Module):
    """Pre-norm attention (block queries over context + block keys) and a SwiGLU MLP."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)  # [B, H, n, d/H]

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)  # [B, K, d]
        k, v = self.kv(torch.cat([ctx, h], dim=1)).chunk(2, dim=-1)  # [B, c + K, d] each
        a = F.scaled_dot_product_attention(
            self._split(self.q(h)), self._split(k), self._split(v), attn_mask=mask
        )
        x = x + self.o(a.transpose(1, 2).reshape(x.shape))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class BlockDrafterNet(nn.Module):
    """The drafter's own weights; the target's embedding and LM head are attached, not owned."""

    def __init__(self, cfg: BlockDrafterConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model {cfg.d_model} is not a multiple of heads {cfg.heads}")
        self.cfg = cfg
        d = cfg.d_model
        self.ctx_proj = nn.Linear(cfg.feature_dim, d, bias=False)
        self.ctx_norm = nn.RMSNorm(d)
        self.in_proj = nn.Linear(cfg.target_hidden, d, bias=False)
        self.mask_embedding = nn.Parameter(torch.randn(cfg.target_hidden) * 0.02)
        self.pos = nn.Embedding(cfg.context + cfg.k, d)  # context slots, then block slots
        self.layers = nn.ModuleList(_BlockLayer(d, cfg.heads, cfg.ffn) for _ in range(cfg.layers))
        self.out_norm = nn.RMSNorm(d)
        self.out_proj = nn.Linear(d, cfg.target_hidden, bias=False)
        self.__dict__["_shared"] = None  # (embedding, lm_head) of the target, kept out of state_dict

    def attach(self, target: PreTrainedModel) -> None:
        """Use ``target``'s embedding and LM head (frozen: gradients stop at their weights)."""
        emb, head = target.get_input_embeddings(), target.get_output_embeddings()
        want = (self.cfg.vocab_size, self.cfg.target_hidden)
        if tuple(emb.weight.shape) != want or tuple(head.weight.shape) != want:
            raise BlockDrafterError(
                f"target embedding {tuple(emb.weight.shape)} / LM head {tuple(head.weight.shape)} "
                f"do not match the drafter's (vocab_size, target_hidden) {want}"
            )
        self.__dict__["_shared"] = (emb, head)

    def forward(self, feats: torch.Tensor, valid: torch.Tensor, roots: torch.Tensor) -> torch.Tensor:
        """feats [B, c, F] (rows right-aligned, see context_slots), valid [B, c] bool, roots [B] ids
        -> logits [B, K, V]; slot i scores the token at root + i + 1."""
        if self._shared is None:
            raise BlockDrafterError("no target attached: call attach(target) first")
        emb, head = self._shared
        cfg = self.cfg
        b = roots.shape[0]
        ctx = self.ctx_norm(self.ctx_proj(feats)) + self.pos.weight[: cfg.context]
        tok = torch.cat(
            [F.embedding(roots, emb.weight.detach())[:, None], self.mask_embedding.expand(b, cfg.k - 1, -1)],
            dim=1,
        )
        x = self.in_proj(tok) + self.pos.weight[cfg.context :]  # [B, K, d]
        block = torch.ones(b, cfg.k, dtype=torch.bool, device=valid.device)
        mask = torch.cat([valid, block], dim=1)[:, None, None, :]  # [B, 1, 1, c + K]
        for layer in self.layers:
            x = layer(x, ctx, mask)
        h = self.out_proj(self.out_norm(x))
        bias = head.bias.detach() if head.bias is not None else None
        return F.linear(h, head.weight.detach(), bias)


class BlockDrafter:
    """decoder.graft.block.BlockProposer over a BlockDrafterNet with its target attached."""

    def __init__(self, net: BlockDrafterNet) -> None:
        self.net = net.eval()
        self.k = net.cfg.k
        self.target_layers = net.cfg.target_layers

    @torch.no_grad()
    def propose(self, features: torch.Tensor | None, committed: list[int], topk: int) -> Marginals:
        cfg = self.net.cfg
        n = len(committed) - 1
        if features is None or tuple(features.shape) != (n, cfg.feature_dim):
            got = None if features is None else tuple(features.shape)
            raise ValueError(
                f"features must be (len(committed) - 1, feature_dim) = {(n, cfg.feature_dim)}, got {got}"
            )
        if not 1 <= topk <= cfg.vocab_size:
            raise ValueError(f"topk must be in 1..{cfg.vocab_size}, got {topk}")
        param = self.net.ctx_proj.weight
        rows, valid = context_slots(torch.tensor([n], device=param.device), cfg.context)
        feats = features.to(param.device, param.dtype)
        window = feats[rows[0]] if n else torch.zeros(cfg.context, cfg.feature_dim, device=param.device)
        roots = torch.tensor([committed[-1]], device=param.device)
        logp = F.log_softmax(self.net(window[None], valid, roots)[0].float(), dim=-1)  # [K, V]
        top = logp.topk(topk, dim=-1)
        return Marginals(top.indices.cpu().numpy().astype(np.int64), top.values.cpu().double().numpy())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _config_digest(fields: dict[str, Any]) -> str:
    return canonical_digest(fields, "config_sha256")


def save_block_drafter(net: BlockDrafterNet, folder: Path | str, extra: dict[str, Any] | None = None) -> Path:
    """Write the drafter's own weights and its config into ``folder``; returns the config path.

    ``extra`` (JSON values, e.g. the target's name) is stored under ``"extra"`` and pinned too.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    blob = save({k: v.detach().cpu().contiguous() for k, v in sorted(net.state_dict().items())})
    fields = {
        **dataclasses.asdict(net.cfg),
        "schema_version": SCHEMA_VERSION,
        "weights_sha256": _sha256(blob),
    }
    fields = json.loads(json.dumps({**fields, "extra": extra or {}}))
    fields["config_sha256"] = _config_digest(fields)
    replace_atomically(folder / WEIGHTS_NAME, blob)
    replace_atomically(folder / CONFIG_NAME, (json.dumps(fields, indent=2, sort_keys=True) + "\n").encode())
    return folder / CONFIG_NAME


def _read_config(path: Path) -> tuple[BlockDrafterConfig, dict[str, Any]]:
    raw = read_json_object(path, BlockDrafterError)
    names = [f.name for f in dataclasses.fields(BlockDrafterConfig)]
    check_field_names(raw, {*names, *WRITER_FIELDS, "extra"}, path, BlockDrafterError)
    if not isinstance(raw["extra"], dict):
        raise BlockDrafterError(f"{path}: field 'extra' must be a JSON object, got {raw['extra']!r}")
    if raw["schema_version"] != SCHEMA_VERSION:
        raise BlockDrafterError(
            f"{path}: field 'schema_version' is {raw['schema_version']!r}, expected {SCHEMA_VERSION!r}"
        )
    if raw["config_sha256"] != _config_digest(raw):
        raise BlockDrafterError(
            f"{path}: field 'config_sha256' does not match the other fields (edited after writing)"
        )
    for name in names:
        value = raw[name]
        ok = (
            isinstance(value, list) and value and all(isinstance(v, int) and v >= 0 for v in value)
            if name == "target_layers"
            else isinstance(value, int) and not isinstance(value, bool) and value > 0
        )
        if not ok:
            raise BlockDrafterError(f"{path}: field {name!r} has a bad value {value!r}")
    cfg = BlockDrafterConfig(**{n: tuple(raw[n]) if n == "target_layers" else raw[n] for n in names})
    return cfg, raw


def _check_fits(cfg: BlockDrafterConfig, target: PreTrainedModel, path: Path) -> None:
    tc = target.config
    checks = (
        ("target_hidden", cfg.target_hidden, tc.hidden_size),
        ("vocab_size", cfg.vocab_size, tc.vocab_size),
    )
    for name, mine, theirs in checks:
        if mine != theirs:
            raise BlockDrafterError(f"{path}: field {name!r} is {mine}, the target has {theirs}")
    if max(cfg.target_layers) > tc.num_hidden_layers:
        raise BlockDrafterError(
            f"{path}: field 'target_layers' {list(cfg.target_layers)} reaches past the target's "
            f"{tc.num_hidden_layers} layers"
        )


def load_block_drafter(folder: Path | str, target: PreTrainedModel) -> BlockDrafter:
    """Read, check and attach a saved drafter to ``target``; see the module contract."""
    folder = Path(folder)
    meta, weights = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for path in (meta, weights):
        if not path.is_file():
            raise BlockDrafterError(
                f"{path}: missing (a block drafter folder holds {CONFIG_NAME} and {WEIGHTS_NAME})"
            )
    try:
        verify_folder(folder)  # the folder's checkpoint_digest.json, where the zoo recorded one
    except CheckpointError as err:
        raise BlockDrafterError(str(err)) from None
    cfg, raw = _read_config(meta)
    if raw["weights_sha256"] != sha256_of_file(weights):
        raise BlockDrafterError(f"{meta}: field 'weights_sha256' does not match {weights}")
    _check_fits(cfg, target, meta)
    net = BlockDrafterNet(cfg)
    state = load_file(str(weights))
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise BlockDrafterError(f"{weights}: tensors do not fit the config in {meta} ({err})") from None
    param = next(target.parameters())
    net.to(device=param.device, dtype=param.dtype)
    net.attach(target)
    return BlockDrafter(net)
