"""Tiny Qwen3/Llama causal LMs: build from a spec, pretrain on token windows, distill a mid drafter.

Contract: everything is plain HF ``AutoModelForCausalLM`` built from a config (no custom modules),
so a zoo model saves with ``save_pretrained`` (safetensors) and reloads exactly like a real
checkpoint. Training is CPU-only and deterministic given the seed and thread count. A mid drafter
is distilled from its target: KL(target || mid) on corpus windows and on the target's own greedy
continuations of chat prompts, which is the text a drafter sees at decode time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from config.params import ModelSpec, TrainParams

log = logging.getLogger(__name__)

MIN_LR_RATE = 0.1  # the cosine's floor, a share of the peak learning rate

ARCHS: dict[str, tuple[type, type[PreTrainedModel]]] = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def build_model(spec: ModelSpec, vocab_size: int, eos_id: int, max_len: int) -> PreTrainedModel:
    """A freshly initialised model of the spec's architecture and size."""
    if spec.arch not in ARCHS:
        raise ValueError(f"unknown arch {spec.arch!r}; known: {sorted(ARCHS)}")
    if spec.d_model % spec.heads or spec.heads % spec.kv_heads:
        raise ValueError(f"d_model {spec.d_model} / heads {spec.heads} / kv {spec.kv_heads} mismatch")
    config_cls, model_cls = ARCHS[spec.arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.d_model // spec.heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return model_cls(config)


@torch.no_grad()
def grow_model(source: PreTrainedModel, spec: ModelSpec, eos_id: int) -> PreTrainedModel:
    """A deeper model computing the same function as ``source`` (progressive stacking).

    Source layer j lands at depth j * L / L_src; every other new layer starts as a copy of the
    layer below with its output projections zeroed, so it adds nothing to the residual stream
    until fine-tuning moves it. Width, heads and vocabulary must match the source.
    """
    cfg = source.config
    n_src = cfg.num_hidden_layers
    if (spec.d_model, spec.ffn, spec.heads) != (cfg.hidden_size, cfg.intermediate_size,
                                                  cfg.num_attention_heads):  # fmt: skip
        raise ValueError("grow_model keeps width: d_model, ffn and heads must match the source")
    if spec.layers < n_src:
        raise ValueError(f"cannot grow {n_src} layers into {spec.layers}")
    model = build_model(spec, cfg.vocab_size, eos_id, cfg.max_position_embeddings)
    src_sd = source.state_dict()
    new_sd = model.state_dict()
    for key in new_sd:
        if ".layers." not in key:
            new_sd[key] = src_sd[key].clone()
    for i in range(spec.layers):
        j = i * n_src // spec.layers
        is_copy = i == -(-j * spec.layers // n_src)  # first new layer mapped to source layer j
        prefix, src_prefix = f"model.layers.{i}.", f"model.layers.{j}."
        for key in new_sd:
            if key.startswith(prefix):
                value = src_sd[src_prefix + key[len(prefix) :]].clone()
                if not is_copy and key.endswith(("o_proj.weight", "down_proj.weight")):
                    value.zero_()
                new_sd[key] = value
    model.load_state_dict(new_sd)
    return model


@dataclass(frozen=True)
class TrainResult:
    steps: int
    final_loss: float
    seconds: float
    tokens_per_s: float


def sample_windows(tokens: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    """[batch, seq_len] random windows of a 1-D token array."""
    starts = rng.integers(0, len(tokens) - seq_len, size=batch)
    return torch.from_numpy(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64))


def warmup_cosine(opt: torch.optim.Optimizer, steps: int, warmup: int) -> LRScheduler:
    """The learning rate per step, as fractions of the optimizer's lr: linear warm-up from 1/warmup at
    step 0 to 1 at step warmup - 1, then a half cosine from 1 at step warmup down towards
    MIN_LR_RATE, which it would reach at step ``steps`` (one past the last). Step it after each
    optimizer step."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 steps, got {warmup}")
    peak = opt.defaults["lr"]
    cosine = CosineAnnealingLR(opt, T_max=max(1, steps - warmup), eta_min=MIN_LR_RATE * peak)
    if warmup == 0:
        return cosine
    linear = LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
    return SequentialLR(opt, [linear, cosine], milestones=[warmup])


def train_loop(
    model: PreTrainedModel,
    next_batch: Callable[[int], torch.Tensor],
    loss_fn: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor],
    steps: int,
    train: TrainParams,
    desc: str,
) -> TrainResult:
    """AdamW with warm-up and cosine decay; ``next_batch(step)`` supplies [B, T] token ids."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = warmup_cosine(opt, steps, train.warmup_steps)
    start, n_tokens, ema = time.perf_counter(), 0, float("nan")
    bar = tqdm(range(steps), desc=desc, mininterval=5.0, leave=False)
    for step in bar:
        batch = next_batch(step)
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        n_tokens += batch.numel()
        ema = loss.item() if math.isnan(ema) else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
    seconds = time.perf_counter() - start
    model.eval()
    log.info("%s: %d steps, loss %.3f, %.1f s, %.0f tok/s", desc, steps, ema, seconds, n_tokens / seconds)
    return TrainResult(steps, ema, seconds, n_tokens / seconds)


def lm_loss(model: PreTrainedModel, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; batch: [B, T]."""
    logits = model(input_ids=batch).logits[:, :-1]  # [B, T-1, V]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def kd_loss(teacher: PreTrainedModel) -> Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]:
    """KL(teacher || student) per position, plus half the teacher-argmax cross-entropy.

    The argmax term sharpens top-1 agreement, which is what greedy tree acceptance rewards.
    """

    def loss(student: PreTrainedModel, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(input_ids=batch).logits.float(), dim=-1)  # [B, T, V]
        s_logp = F.log_softmax(student(input_ids=batch).logits, dim=-1)
        kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="none").sum(-1).mean()
        ce = F.nll_loss(s_logp.reshape(-1, s_logp.size(-1)), t_logp.argmax(-1).reshape(-1))
        return kl + 0.5 * ce

    return loss


@torch.no_grad()
def greedy_continuations(
    model: PreTrainedModel, prompts: torch.Tensor, new_tokens: int, batch: int
) -> torch.Tensor:
    """The model's greedy continuation of each equal-length prompt; [N, P] -> [N, P + new]."""
    model.eval()
    outs = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        out = model.generate(
            input_ids=chunk,
            attention_mask=torch.ones_like(chunk),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=model.config.eos_token_id,
        )
        outs.append(out[:, : chunk.size(1) + new_tokens])
    return torch.cat(outs)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
