"""The oneDNN linear kernel (a pair's ``linear: onednn``): every nn.Linear swapped, the forward
unchanged up to fp32 rounding, speculative decoding still token-identical to HF's greedy output."""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy, tiny_model
from test_lossless import prompts, reference
from torch.utils.mkldnn import MkldnnLinear

from decoder.config import DecodeConfig
from decoder.generate import autoregressive, generate
from decoder.models import load_causal_lm, make_pair

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
    assert linears(model, MkldnnLinear) == n_stock
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
