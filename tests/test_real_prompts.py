"""Natural-language prompts, a tokenizer trained here, models loaded from disk.

The prompts are tests/fixtures/eagle-bench: a few questions of each kind the paper benchmarks
(instructions, word problems, code, two-turn chat), written for these tests in Spec-Bench's
question.jsonl format, so the test runs in any clone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import save_pair, tiny_model, train_tokenizer

from decoder.core.config import DecodeConfig
from decoder.generate import generate
from decoder.models.pair import TokenizerMismatchError, load_pair

BENCH = Path(__file__).resolve().parent / "fixtures" / "eagle-bench"


def questions(limit_per_bench: int) -> list[str]:
    out = []
    for bench in sorted(p for p in BENCH.iterdir() if p.is_dir()):
        with open(bench / "question.jsonl") as f:
            for line in list(f)[:limit_per_bench]:
                out.append(json.loads(line)["turns"][0])
    return out


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    tok = train_tokenizer(questions(80), vocab=400)
    save_pair(root, tok, seed=21)
    return root


def test_real_prompts_lossless_after_loading_from_disk(saved_pair):
    pair = load_pair(saved_pair / "target", saved_pair / "mid")
    assert pair.eos_token_ids == (pair.tokenizer.eos_token_id,)
    assert (saved_pair / "target" / "model.safetensors").is_file()
    for text in questions(2):
        ids = pair.tokenizer(text)["input_ids"][:200]
        ref = pair.target.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=32, pad_token_id=pair.eos_token_ids[0]
        )[0, len(ids) :].tolist()
        for policy in ["ar", "all-small", "all-mid", "10101"]:
            assert generate(pair, ids, policy, DecodeConfig(max_new_tokens=32)).new_tokens == ref


def test_mismatched_tokenizers_are_refused(saved_pair, tmp_path):
    other = train_tokenizer(questions(10), vocab=300)
    model = tiny_model("qwen3", seed=23, vocab=len(other))
    model.save_pretrained(tmp_path / "mid")
    other.save_pretrained(tmp_path / "mid")
    with pytest.raises(TokenizerMismatchError, match="tokenizers differ"):
        load_pair(saved_pair / "target", tmp_path / "mid")
