"""Bad input gets a clear error before any model work, and nothing is produced."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.policies import parse_policy
from decoder.generate import generate
from decoder.models.pair import TokenizerMismatchError, load_causal_lm, make_pair


@pytest.fixture(scope="module")
def pair():
    return make_pair(tiny_model("qwen3", seed=1), tiny_model("qwen3", seed=2), eos_token_ids=(0,))


def test_empty_prompt(pair):
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(pair, [], "all-small")


def test_prompt_longer_than_context(pair):
    with pytest.raises(ValueError, match="exceeds the target's context of 1024"):
        generate(pair, [1] * 1020, "all-mid", DecodeConfig(max_new_tokens=8))


def test_token_ids_out_of_range(pair):
    with pytest.raises(ValueError, match="outside"):
        generate(pair, [1, 2, 500], "ar")


@pytest.mark.parametrize("field", ["depth", "width", "topk", "budget", "ngram_chain_len"])
@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_budgets(field, value):
    with pytest.raises(ValueError, match=f"TreeConfig.{field} must be positive"):
        TreeConfig(**{field: value})


def test_non_positive_max_new_tokens_and_negative_temperature():
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        DecodeConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        DecodeConfig(temperature=-1)


@pytest.mark.parametrize("bad", ["1010", "101010", "10a01", "", "mid"])
def test_schedule_string_of_wrong_shape(bad):
    with pytest.raises(ValueError, match="string of 5 bits"):
        parse_policy(bad, 5)


def test_mid_policy_without_mid(pair):
    alone = make_pair(pair.target, eos_token_ids=(0,))
    with pytest.raises(ValueError, match="has none"):
        generate(alone, [1, 2, 3], "10101")


def test_models_with_different_vocab_sizes_and_no_tokenizer():
    with pytest.raises(TokenizerMismatchError, match="embedding sizes differ"):
        make_pair(tiny_model("qwen3", seed=1), tiny_model("qwen3", seed=2, vocab=80))


def test_not_a_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_causal_lm(tmp_path)
