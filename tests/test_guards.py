"""Guards: context room for the deepest tree, mask-honouring attention, generation-config
processors, and an accepted length that counts only emitted drafted tokens."""

from __future__ import annotations

import copy

import pytest
from conftest import noisy_copy, tiny_model
from test_lossless import prompts, reference

from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.decode import max_tree_depth
from decoder.generate import generate
from decoder.models.pair import MASK_ATTENTION, ModelPair, load_causal_lm, make_pair


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3", seed=21)
    return make_pair(target, noisy_copy(target, 0.3, seed=22), eos_token_ids=())


def test_context_check_counts_the_deepest_tree(pair):
    cfg = DecodeConfig(max_new_tokens=8)
    depth = max_tree_depth(cfg)
    assert depth == cfg.tree.depth * cfg.tree.ngram_chain_len
    fits = [3] * (pair.context_len - cfg.max_new_tokens - depth)
    over = [*fits, 3]
    assert len(generate(pair, fits, "all-small", cfg).new_tokens) == 8
    with pytest.raises(ValueError, match=rf"deepest draft tree \({depth} tokens\).*target's context of 1024"):
        generate(pair, over, "all-small", cfg)
    # AR builds no tree: the same prompt fits
    assert len(generate(pair, over, "ar", cfg).new_tokens) == 8


def test_context_check_covers_the_mid_drafter():
    target = tiny_model("qwen3", seed=23)
    short_mid = copy.deepcopy(target)
    short_mid.config.max_position_embeddings = 256
    small = make_pair(target, short_mid, eos_token_ids=())
    cfg = DecodeConfig(max_new_tokens=8)
    prompt = [4] * 300
    with pytest.raises(ValueError, match="mid drafter's context of 256"):
        generate(small, prompt, "10101", cfg)
    assert len(generate(small, prompt, "all-small", cfg).new_tokens) == 8  # the mid is never called


def test_flash_attention_is_refused_and_loading_picks_sdpa(tmp_path):
    model = tiny_model("llama", seed=24)
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(tmp_path)
    assert loaded.config._attn_implementation in MASK_ATTENTION
    with pytest.raises(ValueError, match="does not honour the 4D tree masks"):
        load_causal_lm(tmp_path, attn_implementation="flash_attention_2")
    flash = tiny_model("llama", seed=24)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"target: attention implementation 'flash_attention_2'"):
        make_pair(flash)
    with pytest.raises(ValueError, match=r"mid: attention implementation"):
        make_pair(model, flash)


def test_eager_attention_is_lossless_too(tmp_path):
    target = tiny_model("qwen3", seed=25)
    target.save_pretrained(tmp_path / "t")
    noisy_copy(target, 0.3, seed=26).save_pretrained(tmp_path / "m")
    eager = make_pair(
        load_causal_lm(tmp_path / "t", attn_implementation="eager"),
        load_causal_lm(tmp_path / "m", attn_implementation="eager"),
        eos_token_ids=(0,),
    )
    assert eager.target.config._attn_implementation == "eager"
    for prompt in prompts(96, 2, seed=27):
        ref = reference(target, prompt, 24)
        for policy in ("all-small", "all-mid", "10101"):
            assert generate(eager, prompt, policy, DecodeConfig(max_new_tokens=24)).new_tokens == ref


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("repetition_penalty", 1.3),
        ("no_repeat_ngram_size", 3),
        ("suppress_tokens", [5]),
        ("min_new_tokens", 4),
        ("guidance_scale", 1.5),
    ],
)
@pytest.mark.parametrize("side", ["target", "mid"])
def test_generation_config_processors_are_refused(setting, value, side):
    target = tiny_model("qwen3", seed=28)
    mid = noisy_copy(target, 0.3, seed=29)
    setattr((target if side == "target" else mid).generation_config, setting, value)
    p = make_pair(target, mid, eos_token_ids=())
    name = "target" if side == "target" else "mid drafter"
    with pytest.raises(ValueError, match=rf"the {name}'s generation config sets {setting}="):
        generate(p, [1, 2, 3], "10101", DecodeConfig(max_new_tokens=4))


def test_sampling_warpers_are_refused_only_when_sampling():
    target = tiny_model("qwen3", seed=30)
    target.generation_config.top_p = 0.8
    target.generation_config.top_k = 20
    p = make_pair(target, eos_token_ids=(0,))
    prompt = prompts(96, 1, seed=31)[0]
    with pytest.raises(ValueError, match=r"top_k=20, top_p=0\.8"):
        generate(p, prompt, "all-small", DecodeConfig(max_new_tokens=4, temperature=0.7))
    # greedy decoding applies no warpers (neither does the model's own greedy generate)
    ref = reference(target, prompt, 16)
    assert generate(p, prompt, "all-small", DecodeConfig(max_new_tokens=16)).new_tokens == ref


def test_top_h_warper_is_refused_when_sampling():
    target = tiny_model("qwen3", seed=30)
    target.generation_config.top_h = 0.4
    p = make_pair(target, eos_token_ids=(0,))
    with pytest.raises(ValueError, match=r"target's generation config sets top_h=0\.4"):
        generate(p, [1, 2, 3], "all-small", DecodeConfig(max_new_tokens=4, temperature=0.7))
    assert len(generate(p, [1, 2, 3], "all-small", DecodeConfig(max_new_tokens=4)).new_tokens) == 4


@pytest.mark.parametrize("side", ["target", "mid"])
def test_flash_attention_is_refused_in_pairs_not_built_by_make_pair(side):
    """A ModelPair assembled by hand (or a model switched after make_pair) is checked by generate."""
    target = tiny_model("llama", seed=24)
    mid = noisy_copy(target, 0.3, seed=25)
    pair = make_pair(target, mid, eos_token_ids=())
    (target if side == "target" else mid).config._attn_implementation = "flash_attention_2"
    name = "target" if side == "target" else "mid drafter"
    with pytest.raises(ValueError, match=rf"{name}: attention implementation 'flash_attention_2'"):
        generate(pair, [1, 2, 3], "10101", DecodeConfig(max_new_tokens=4))
    hand_made = ModelPair(target, None, (), pair.vocab_size)
    if side == "target":
        with pytest.raises(ValueError, match="does not honour the 4D tree masks"):
            generate(hand_made, [1, 2, 3], "all-small", DecodeConfig(max_new_tokens=4))


def test_accepted_counts_only_emitted_drafted_tokens():
    target = tiny_model("qwen3", seed=32)
    twin = make_pair(target, copy.deepcopy(target), eos_token_ids=())  # the mid agrees with the target
    prompt = prompts(96, 1, seed=33)[0]
    tree = TreeConfig(depth=5)
    long = generate(twin, prompt, "all-mid", DecodeConfig(max_new_tokens=40, tree=tree))
    i = max(range(len(long.rounds) - 1), key=lambda j: long.rounds[j].accepted)
    assert long.rounds[i].accepted >= 2  # a deep round: cutting the budget inside it must bite
    before = 1 + sum(r.emitted for r in long.rounds[:i])  # the prefill's token, then the rounds'
    short = generate(twin, prompt, "all-mid", DecodeConfig(max_new_tokens=before + 1, tree=tree))
    assert short.new_tokens == long.new_tokens[: before + 1]
    assert [r.accepted for r in short.rounds[:-1]] == [r.accepted for r in long.rounds[:i]]
    assert short.rounds[-1].emitted == 1 and short.rounds[-1].accepted == 1
    for res in (long, short):
        assert sum(r.emitted for r in res.rounds) == len(res.new_tokens) - 1  # prefill: token 1
        assert all(r.accepted == r.emitted - 1 for r in res.rounds[:-1])
        assert res.rounds[-1].accepted <= res.rounds[-1].emitted


def test_accepted_stops_at_eos():
    target = tiny_model("qwen3", seed=32)
    prompt = prompts(96, 1, seed=33)[0]
    free = reference(target, prompt, 12, eos=None)
    eos = free[1]
    if eos in free[:1]:
        pytest.skip("the second greedy token repeats the first")
    twin = make_pair(target, copy.deepcopy(target), eos_token_ids=(eos,))
    res = generate(twin, prompt, "all-mid", DecodeConfig(max_new_tokens=12))
    assert res.new_tokens == free[:2] and res.stopped_at_eos
    assert res.rounds[-1].accepted <= 2 and sum(r.accepted for r in res.rounds) <= 2


def test_tree_positions_stay_inside_the_context(pair):
    """With the room the check demands, no forward ever sees a position >= the context."""
    cfg = DecodeConfig(max_new_tokens=6, tree=TreeConfig(ngram_chain_len=4))
    prompt = ([7, 8, 9, 10] * 400)[: pair.context_len - cfg.max_new_tokens - max_tree_depth(cfg)]
    seen = []
    hooks = [
        m.get_decoder().register_forward_pre_hook(
            lambda _m, _a, kw: seen.append(int(kw["position_ids"].max())), with_kwargs=True
        )
        for m in (pair.target, pair.mid)
    ]
    try:
        generate(pair, prompt, "all-mid", cfg)
        generate(pair, prompt, "all-small", cfg)
    finally:
        for h in hooks:
            h.remove()
    assert seen and max(seen) < pair.context_len
