"""decoder.check_lossless: fp32 strict; bf16 divergences classified as near-ties or real mismatches."""

from __future__ import annotations

import collections
import copy
import sysconfig
from pathlib import Path

import pytest
import torch
from conftest import noisy_copy, save_pair, tiny_model, train_tokenizer
from test_lossless import prompts, reference

from collectors.evaluation.cell import LosslessError, lossless_gate
from decoder.check_lossless import check_outputs, compare, fp32_judge, main
from decoder.core.config import DecodeConfig
from decoder.core.outcome import GenerationResult
from decoder.generate import generate
from decoder.models.pair import make_pair

CFG = DecodeConfig(max_new_tokens=40)


@pytest.fixture(scope="module")
def twinned():
    """A target whose frequent greedy tokens each have a near-twin output row: near-ties abound,
    so bf16 rounding flips some argmaxes between tree and one-token forwards."""
    target = tiny_model("qwen3", seed=11)
    ps = prompts(96, 6, seed=11)
    plain = make_pair(target, eos_token_ids=())
    freq = collections.Counter(t for p in ps for t in generate(plain, p, "ar", CFG).new_tokens)
    gen = torch.Generator().manual_seed(11)
    twins = {}
    with torch.no_grad():
        w = target.lm_head.weight
        for i, (a, _) in enumerate(freq.most_common(6)):
            w[90 + i] = w[a] + 0.003 * w[a].abs().mean() * torch.randn(w.shape[1], generator=gen)
            twins[a] = 90 + i
    return target, ps, twins


def test_bf16_divergences_are_all_near_ties(twinned):
    target, ps, _twins = twinned
    judge = fp32_judge(target)
    bf16 = copy.deepcopy(target).to(torch.bfloat16)
    pair = make_pair(bf16, noisy_copy(judge, 0.3, seed=5).to(torch.bfloat16), eos_token_ids=())
    refs = [generate(pair, p, "ar", CFG).new_tokens for p in ps]
    for policy in ("all-small", "all-mid", "10101"):
        outs = [generate(pair, p, policy, CFG).new_tokens for p in ps]
        report = check_outputs(judge, ps, refs, outs, torch.bfloat16)
        assert report.sequence_agreement < 1.0, "no divergence: the test would not exercise the classifier"
        assert report.n_near_ties > 0 and report.ok, report.summary()
        for c in report.checks:
            for d in c.divergences:
                assert d.gap <= d.tolerance and d.got != d.expected


def test_fp32_is_token_identical_and_strict(twinned):
    target, ps, twins = twinned
    pair = make_pair(target, noisy_copy(target, 0.3, seed=5), eos_token_ids=(0,))
    refs = [reference(target, p, 40) for p in ps]
    outs = [generate(pair, p, "10101", CFG).new_tokens for p in ps]
    report = check_outputs(target, ps, refs, outs, torch.float32)
    assert report.sequence_agreement == 1.0 and report.token_agreement == 1.0 and report.ok
    # swap a token for its near-twin: a near-tie in bf16, a real mismatch in fp32 (no tolerance)
    p, ref = next((p, r) for p, r in zip(ps, refs, strict=True) if any(t in twins for t in r))
    j = next(k for k, t in enumerate(ref) if t in twins)
    swapped = [*ref[:j], twins[ref[j]]]
    assert compare(target, p, ref, swapped, torch.bfloat16).divergences[0].near_tie
    strict = compare(target, p, ref, swapped, torch.float32)
    assert not strict.divergences[0].near_tie and strict.real_mismatches


def test_a_far_token_is_a_real_mismatch(twinned):
    target, ps, _twins = twinned
    p = ps[0]
    ref = reference(target, p, 20, eos=None)
    with torch.inference_mode():
        logits = target(torch.tensor([p + ref[:5]])).logits[0, -1]
    worst = int(logits.argmin())
    bad = [*ref[:5], worst, *ref[6:]]
    check = compare(target, p, ref, bad, torch.bfloat16)
    assert check.agreed_prefix == 5 and not check.identical
    first = check.divergences[0]
    assert (first.position, first.expected, first.got) == (5, ref[5], worst) and not first.near_tie
    assert check.real_mismatches


def test_an_output_that_stops_early_is_a_real_mismatch(twinned):
    target, ps, _twins = twinned
    ref = reference(target, ps[1], 10, eos=None)
    check = compare(target, ps[1], ref, ref[:6], torch.bfloat16)
    assert check.agreed_prefix == 6 and [d.position for d in check.real_mismatches] == [6]


def test_cli_reports_agreement_in_bf16(tmp_path, capsys):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [f.read_text(errors="ignore") for f in sorted(stdlib.glob("*.py"))[:10]]
    save_pair(tmp_path, train_tokenizer(texts, vocab=300), seed=45)
    argv = ["--target", str(tmp_path / "target"), "--mid", str(tmp_path / "mid"), "--raw"]
    argv += ["--prompt", "def f(x):\n    return x", "--prompt", "import os", "--max-new-tokens", "16"]
    assert main([*argv, "--policy", "all-small", "--policy", "10101"]) == 0
    out = capsys.readouterr().out
    assert "all-small      2 prompts" in out and "10101          2 prompts" in out
    assert "real mismatches   0" in out
    assert main([*argv, "--policy", "ar"]) == 2


def test_evaluation_gate_allows_near_ties_only_below_fp32(twinned):
    target, ps, twins = twinned
    refs = [reference(target, p, 40) for p in ps]
    p, ref = next((p, r) for p, r in zip(ps, refs, strict=True) if any(t in twins for t in r))
    j = next(k for k, t in enumerate(ref) if t in twins)

    def results(out: list[int]) -> dict[str, list[GenerationResult]]:
        return {
            "ar": [GenerationResult(ref, [], 0.0, 1.0, False)],
            "x": [GenerationResult(out, [], 0.0, 1.0, False)],
        }

    tied = [*ref[:j], twins[ref[j]]]
    bf16 = make_pair(copy.deepcopy(target).to(torch.bfloat16), eos_token_ids=())
    reports = lossless_gate(bf16, [p], results(tied))
    assert reports["x"].n_near_ties == 1 and reports["x"].sequence_agreement == 0.0 and reports["ar"].ok
    with pytest.raises(LosslessError, match="beyond numerical near-ties"):
        lossless_gate(make_pair(target, eos_token_ids=()), [p], results(tied))  # fp32: strict
    with torch.inference_mode():
        worst = int(target(torch.tensor([p + ref[:j]])).logits[0, -1].argmin())
    with pytest.raises(LosslessError, match=r"\['x'\]"):
        lossless_gate(bf16, [p], results([*ref[:j], worst]))
