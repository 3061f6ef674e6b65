"""The lossless and numerics checks on CUDA (fp32 and bf16); skipped without a GPU. `make test-gpu`."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import noisy_copy, tiny_model
from test_check_lossless import CFG, twinned  # noqa: F401 - the fixture is used by name
from test_lossless import POLICIES, prompts

from decoder.check_lossless import check_outputs, fp32_judge
from decoder.core.config import DecodeConfig
from decoder.generate import generate
from decoder.models.pair import make_pair

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fp32_on_cuda_is_token_identical(arch):
    target = tiny_model(arch, seed=11).cuda()
    pair = make_pair(target, noisy_copy(target, 0.3, seed=12), eos_token_ids=(0,))
    for prompt in prompts(pair.vocab_size, 3, seed=1):
        ids = torch.tensor([prompt], device="cuda")
        ref = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=40,
            eos_token_id=0,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        for policy in POLICIES:
            res = generate(pair, prompt, policy, DecodeConfig(max_new_tokens=40))
            assert res.new_tokens == ref, policy


def test_bf16_on_cuda_every_divergence_is_a_near_tie(twinned):  # noqa: F811
    target, ps, _ = twinned
    judge = fp32_judge(target).cuda()
    bf16 = copy.deepcopy(judge).to(torch.bfloat16)
    pair = make_pair(bf16, noisy_copy(judge, 0.3, seed=5).to(torch.bfloat16), eos_token_ids=())
    refs = [generate(pair, p, "ar", CFG).new_tokens for p in ps]
    for policy in ("all-small", "all-mid", "10101"):
        outs = [generate(pair, p, policy, CFG, timing=False).new_tokens for p in ps]
        report = check_outputs(judge, ps, refs, outs, torch.bfloat16)
        assert report.ok, report.summary()


def test_sampling_on_cuda_keeps_rows_on_the_device():
    target = tiny_model("qwen3", seed=13).cuda()
    pair = make_pair(target, noisy_copy(target, 0.3, seed=14), eos_token_ids=())
    res = generate(pair, prompts(96, 1, seed=2)[0], "10101", DecodeConfig(max_new_tokens=24, temperature=0.8))
    assert len(res.new_tokens) == 24
