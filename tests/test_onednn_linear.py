"""The oneDNN linear kernel (a pair's ``linear: onednn``): every nn.Linear swapped, the forward
unchanged up to fp32 rounding and bit-identical to torch's MkldnnLinear (the path before weights were
held once), each weight held once (a tied LM head too), speculative decoding still token-identical
to HF's greedy output."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from conftest import noisy_copy, tiny_model
from test_lossless import prompts, reference
from torch.utils.mkldnn import MkldnnLinear
from transformers import Qwen2Config, Qwen2ForCausalLM

from config.params import ModelSpec
from decoder.core.config import DecodeConfig
from decoder.core.decode import autoregressive
from decoder.generate import generate
from decoder.models.onednn_linear import OneDNNLinear
from decoder.models.pair import load_causal_lm, make_pair, use_onednn_linears
from models.lm_training import build_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def linears(model: torch.nn.Module, kind: type) -> int:
    return sum(type(m) is kind for m in model.modules())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("onednn")
    target = tiny_model("qwen3", seed=31)
    target.save_pretrained(root / "t")
    noisy_copy(target, 0.3, seed=32).save_pretrained(root / "m")
    return root, target


def test_every_linear_is_swapped_and_logits_keep_to_fp32_rounding(saved):
    root, stock = saved
    model = load_causal_lm(root / "t", linear="onednn")
    n_stock = linears(stock, torch.nn.Linear)
    assert n_stock == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    assert linears(model, torch.nn.Linear) == 0
    assert linears(model, OneDNNLinear) == n_stock
    ids = torch.tensor([prompts(96, 1, seed=33)[0]])
    with torch.inference_mode():
        ref, got = stock(input_ids=ids).logits, model(input_ids=ids).logits
    assert got.dtype == torch.float32
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)


def test_speculative_decoding_on_onednn_linears_is_lossless(saved):
    root, stock = saved
    target, mid = (load_causal_lm(root / name, linear="onednn") for name in ("t", "m"))
    pair = make_pair(target, mid, eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    for prompt in prompts(96, 3, seed=34):
        ref = reference(stock, prompt, 24)
        assert autoregressive(pair, prompt, config).new_tokens == ref
        for policy in ("all-small", "all-mid", "10101"):
            assert generate(pair, prompt, policy, config).new_tokens == ref


def test_onednn_refuses_what_it_cannot_run(saved):
    root, _ = saved
    with pytest.raises(ValueError, match=r"linear kernel must be one of \('stock', 'onednn'\), got 'mkl'"):
        load_causal_lm(root / "t", linear="mkl")
    with pytest.raises(ValueError, match=r"linear kernel 'onednn' takes .* the model is torch.float16"):
        load_causal_lm(root / "t", dtype="float16", linear="onednn")


def tied_model(arch: str) -> torch.nn.Module:
    """A tiny random model whose LM head is its input embedding: a zoo target as models/zoo.py builds
    it (Qwen3), or a Qwen2 with q/k/v biases like the real Qwen2.5-Coder pair."""
    torch.manual_seed(35)
    if arch == "zoo-qwen3":
        shape = dict(arch="qwen3", layers=2, d_model=64, heads=4, kv_heads=2, ffn=128)
        spec = ModelSpec(
            **shape, steps=0, teacher="", init_from="", distill_prompts=0, distill_new_tokens=0, corpus=()
        )
        return build_model(spec, vocab_size=96, eos_id=0, max_len=256)
    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return Qwen2ForCausalLM(config)


def copy_to_mkldnn(model: torch.nn.Module) -> None:
    """The swap as it was before weights were held once: torch's MkldnnLinear copies each weight."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, MkldnnLinear(child, model.dtype))


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct tensor memory the model's parameters and buffers hold (a oneDNN tensor
    has no storage: its own numel counts)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_mkldnn:
            total += t.numel() * t.element_size()
        elif t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def mapped_files() -> str:
    """The files this process maps (Linux); empty elsewhere."""
    maps = Path("/proc/self/maps")
    return maps.read_text() if maps.is_file() else ""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["zoo-qwen3", "qwen2"])
def test_onednn_holds_every_weight_once_and_keeps_the_copying_paths_logits(tmp_path, arch, dtype):
    if dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no oneDNN bf16 path")
    tied_model(arch).save_pretrained(tmp_path)
    ids = torch.tensor([prompts(96, 1, seed=36)[0]])
    before = load_causal_lm(tmp_path, dtype)
    copy_to_mkldnn(before)
    with torch.inference_mode():
        logits_before = before(input_ids=ids).logits
    bytes_before = tensor_bytes(before)
    del before
    model = load_causal_lm(tmp_path, dtype)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    held = tensor_bytes(model)
    assert bytes_before > held  # the copying path held the tied head twice
    params = dict(model.named_parameters())
    storages = [weakref.ref(p.untyped_storage()) for p in params.values()]
    layers = [weakref.ref(m) for m in model.modules() if type(m) is torch.nn.Linear]
    assert use_onednn_linears(model) == len(layers) == 2 * 7 + 1
    gc.collect()
    # nothing of the load is kept aside: no nn.Linear, no storage the loaded weights had, no mapping
    assert all(ref() is None for ref in layers)
    assert all(ref() is None for ref in storages)
    assert str(tmp_path / "model.safetensors") not in mapped_files()
    # held once: the same Parameters (the tied head is the embedding), each in aligned memory
    assert dict(model.named_parameters()) == params
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tensor_bytes(model) == held
    assert all(m.weight.data_ptr() % 64 == 0 for m in model.modules() if type(m) is OneDNNLinear)
    assert model.state_dict().keys() == load_causal_lm(tmp_path, dtype).state_dict().keys()
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, logits_before)


def test_onednn_refuses_a_layer_of_another_dtype_before_swapping_any(saved):
    root, _ = saved
    model = load_causal_lm(root / "t")
    model.model.layers[1].mlp.down_proj.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"'down_proj' holds torch.bfloat16, the model is torch.float32"):
        use_onednn_linears(model)
    assert linears(model, OneDNNLinear) == 0
