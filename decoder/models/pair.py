"""Loading a target/mid pair of stock HF causal LMs by local path, and checking they fit together.

Contract: both models must speak the same token ids. With tokenizers at hand we compare the full
vocabularies (token -> id) and the special-token ids; without them (tests on random models) we
only compare embedding sizes. Per-model differences stay data: EOS ids come from the checkpoint's
generation config or tokenizer, never from code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from decoder.models.checkpoint import verify_folder
from decoder.models.onednn_linear import OneDNNLinear, rehome_tensors

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MASK_ATTENTION = ("sdpa", "eager")  # attention implementations that apply a custom 4D float mask
# How a model's nn.Linear layers run: "stock" as loaded; "onednn" by oneDNN's inner product on the
# layer's own weight (decoder.models.onednn_linear.OneDNNLinear: held once, a tied head stays tied) on CPU.
# On this CPU the stock fp32 matmul of 2-3 rows costs 2-3x one row's (MKL's small-M path), oneDNN's
# about 1.1-1.8x.
LINEAR_KERNELS = ("stock", "onednn")
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


class TokenizerMismatchError(ValueError):
    """The target and mid drafter do not share one tokenizer."""


@dataclass(frozen=True)
class ModelPair:
    """A target, an optional mid drafter, and what generation needs to know about them."""

    target: PreTrainedModel
    mid: PreTrainedModel | None
    eos_token_ids: tuple[int, ...]
    vocab_size: int  # ids the drafters may propose (the shared tokenizer's size)
    tokenizer: object | None = None

    @property
    def context_len(self) -> int:
        return context_of(self.target)


def context_of(model: PreTrainedModel) -> int:
    """Positions the model can encode (its max_position_embeddings; unbounded if it has none)."""
    return int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)


def eos_ids_of(model: PreTrainedModel, tokenizer: object | None) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))


def check_tokenizers_match(target_tok: object, mid_tok: object) -> None:
    """Raise TokenizerMismatchError unless both tokenizers map every token to the same id."""
    a, b = target_tok.get_vocab(), mid_tok.get_vocab()
    if a != b:
        only_a = len(set(a.items()) - set(b.items()))
        only_b = len(set(b.items()) - set(a.items()))
        raise TokenizerMismatchError(
            f"target and mid tokenizers differ: {len(a)} vs {len(b)} tokens, "
            f"{only_a} (token, id) pairs only in the target's, {only_b} only in the mid's"
        )
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        x, y = getattr(target_tok, attr, None), getattr(mid_tok, attr, None)
        if x != y:
            raise TokenizerMismatchError(f"{attr} differs: target {x}, mid {y}")


def check_supported(model: PreTrainedModel, name: str) -> None:
    """Tree masks need full attention in every layer and an attention kernel that honours a custom
    4D float mask (eager or sdpa; flash-attention kernels take only padding masks)."""
    cfg = model.config
    layer_types = getattr(cfg, "layer_types", None) or []
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in layer_types:
        raise ValueError(f"{name}: sliding-window attention is not supported by tree verification")
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    if impl not in MASK_ATTENTION:
        raise ValueError(
            f"{name}: attention implementation {impl!r} does not honour the 4D tree masks; "
            f"load it with attn_implementation in {MASK_ATTENTION} "
            f"(e.g. model.set_attn_implementation('sdpa'))"
        )


def make_pair(
    target: PreTrainedModel,
    mid: PreTrainedModel | None = None,
    tokenizer: object | None = None,
    mid_tokenizer: object | None = None,
    eos_token_ids: tuple[int, ...] | None = None,
) -> ModelPair:
    """Validate and bundle already-loaded models."""
    check_supported(target, "target")
    vocab = target.get_input_embeddings().num_embeddings
    if tokenizer is not None:
        vocab = min(vocab, len(tokenizer))
    if mid is not None:
        check_supported(mid, "mid")
        if tokenizer is not None and mid_tokenizer is not None:
            check_tokenizers_match(tokenizer, mid_tokenizer)
        mid_vocab = mid.get_input_embeddings().num_embeddings
        if tokenizer is None and mid_vocab != target.get_input_embeddings().num_embeddings:
            raise TokenizerMismatchError(
                f"embedding sizes differ (target {vocab}, mid {mid_vocab}) and no tokenizers given"
            )
        vocab = min(vocab, mid_vocab)
    eos = eos_token_ids if eos_token_ids is not None else eos_ids_of(target, tokenizer)
    return ModelPair(target.eval(), None if mid is None else mid.eval(), eos, vocab, tokenizer)


def check_device(device: str) -> torch.device:
    """A torch device that exists on this machine, or a clear error."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available here (torch {torch.__version__})")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available on this machine")
    return dev


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Swap every nn.Linear of a CPU model for OneDNNLinear, in place; return how many. The modeling
    code stays stock, and so do the weights' values: every tensor is first moved, once, into aligned
    memory of its own (decoder.models.onednn_linear.rehome_tensors: a checkpoint's file mapping goes), and
    each swapped layer keeps its own Parameters (held once, a tied LM head still the input
    embedding's tensor); only the kernel that runs the matmul changes."""
    if model.device.type != "cpu":
        raise ValueError(f"linear kernel 'onednn' runs on CPU only; the model is on {model.device}")
    if model.dtype not in ONEDNN_DTYPES:
        raise ValueError(f"linear kernel 'onednn' takes {ONEDNN_DTYPES}, the model is {model.dtype}")
    if not torch.backends.mkldnn.is_available():
        raise ValueError(f"linear kernel 'onednn': this torch ({torch.__version__}) has no oneDNN")
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear
    ]
    for _, name, child in swaps:
        # one oneDNN op multiplies tensors of one dtype; refuse before any layer is swapped
        if child.weight.dtype != model.dtype:
            raise ValueError(
                f"linear kernel 'onednn': layer {name!r} holds {child.weight.dtype}, "
                f"the model is {model.dtype}"
            )
    rehome_tensors(model)
    for parent, name, child in swaps:
        setattr(parent, name, OneDNNLinear(child))
    return len(swaps)


def load_causal_lm(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str = "sdpa",
    linear: str = "stock",
) -> PreTrainedModel:
    """A stock transformers model from a local folder, with a mask-honouring attention kernel and
    the chosen linear kernel (LINEAR_KERNELS); never reaches for a hub."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a model folder (no config.json)")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if linear not in LINEAR_KERNELS:
        raise ValueError(f"linear kernel must be one of {LINEAR_KERNELS}, got {linear!r}")
    if attn_implementation not in MASK_ATTENTION:
        raise ValueError(
            f"attn_implementation {attn_implementation!r} does not honour the 4D tree masks; "
            f"use one of {MASK_ATTENTION}"
        )
    dev = check_device(device)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    verify_folder(path)  # a recorded folder (zoo, real pair) must match its digests
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], local_files_only=True, attn_implementation=attn_implementation
        )
    except SafetensorError as err:  # a cut or garbled file: one error naming the folder, for the CLI
        raise ValueError(f"{path}: unreadable safetensors checkpoint ({err})") from None
    model = model.to(dev).eval()
    if linear == "onednn":
        use_onednn_linears(model)
    return model


def load_pair(
    target_path: str | Path,
    mid_path: str | Path | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    linear: str = "stock",
) -> ModelPair:
    """Load target (+ mid) and their tokenizers from local folders and check they match."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for path in (target_path, mid_path):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a model folder (no config.json)")
    target = load_causal_lm(target_path, dtype, device, linear=linear)
    tok = AutoTokenizer.from_pretrained(target_path, local_files_only=True)
    mid = mid_tok = None
    if mid_path is not None:
        mid = load_causal_lm(mid_path, dtype, device, linear=linear)
        mid_tok = AutoTokenizer.from_pretrained(mid_path, local_files_only=True)
    return make_pair(target, mid, tok, mid_tok)
