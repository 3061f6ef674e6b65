"""The `ddtree` policy is lossless: greedy token-identical to the target, sampling distribution-exact."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import noisy_copy, tiny_model
from test_lossless import EOS, prompts, reference
from test_sampling import chi2_pvalue_ok
from test_sampling_e2e import check_two_token_joint

from decoder.core.config import BlockConfig, DecodeConfig
from decoder.core.sampling import sample_walk
from decoder.generate import generate
from decoder.graft.ddtree import build_ddtree
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair

# (budget, m, K): B = 1, small, the default, and more than the sum of m^d (3 + 9 + 27 = 39) allows
SHAPES = [(1, 4, 4), (5, 2, 3), (63, 8, 8), (1000, 3, 3)]


@pytest.fixture(scope="module")
def pairs():
    made = {}
    for arch in ("qwen3", "llama"):
        target = tiny_model(arch, seed=11)
        made[arch] = make_pair(target, noisy_copy(target, noise=0.3, seed=12), eos_token_ids=(EOS,))
    return made


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize(("budget", "m", "k"), SHAPES)
def test_greedy_ddtree_is_token_identical(pairs, arch, budget, m, k):
    pair = pairs[arch]
    config = DecodeConfig(max_new_tokens=40, block=BlockConfig(budget=budget, topk=m, k=k))
    accepted, sizes = [], []
    for prompt in prompts(pair.vocab_size, 3, seed=budget):
        res = generate(pair, prompt, "ddtree", config)
        assert res.new_tokens == reference(pair.target, prompt, 40), f"{arch} B={budget} m={m} K={k}"
        accepted += [r.accepted for r in res.rounds]
        sizes += [r.verified_size for r in res.rounds]
    assert set(sizes) == {min(budget, sum(m**d for d in range(1, k + 1)))}
    if budget > 1:
        assert max(accepted) >= 2, "trees never got past depth 1: compaction would go untested"


def test_a_given_proposer_is_used_and_stops_like_the_target(pairs):
    pair = pairs["llama"]
    prompt = prompts(pair.vocab_size, 1, seed=5)[0]
    free = reference(pair.target, prompt, 30, eos=None)
    stop = next(i for i in range(3, len(free)) if free[i] not in free[:i])
    eos_pair = make_pair(pair.target, None, eos_token_ids=(free[stop],))
    proposer = CausalLMProposer(pair.mid, pair.vocab_size, k=5)
    res = generate(eos_pair, prompt, "ddtree", DecodeConfig(max_new_tokens=30), proposer=proposer)
    assert res.new_tokens == free[: stop + 1] and res.stopped_at_eos
    assert sum(r.emitted for r in res.rounds) == len(res.new_tokens) - 1  # the prefill yields token 1
    for max_new in (1, 2, 7):
        out = generate(pair, prompt, "ddtree", DecodeConfig(max_new_tokens=max_new), proposer=proposer)
        assert out.new_tokens == reference(pair.target, prompt, max_new)


def test_single_token_prompt_and_a_pair_without_a_proposer(pairs):
    pair = pairs["qwen3"]
    assert generate(pair, [5], "ddtree", DecodeConfig(max_new_tokens=20)).new_tokens == reference(
        pair.target, [5], 20
    )
    with pytest.raises(ValueError, match="block proposer"):
        generate(make_pair(pair.target, None, eos_token_ids=(EOS,)), [5, 6], "ddtree")


def test_prompts_that_leave_no_room_for_the_tree_are_refused(pairs):
    pair = pairs["qwen3"]
    room = pair.target.config.max_position_embeddings
    prompt = [3] * (room - 10)
    with pytest.raises(ValueError, match="deepest DDTree"):
        generate(pair, prompt, "ddtree", DecodeConfig(max_new_tokens=5, block=BlockConfig(k=8)))


def test_sampling_over_a_ddtree_walk_keeps_the_two_token_joint():
    """Tree level: rejection sampling down a DDTree from random marginals emits p(t1) p(t2 | t1)."""
    rng = np.random.default_rng(4)
    vocab = 6
    first = rng.dirichlet(np.ones(vocab))
    second = rng.dirichlet(np.ones(vocab), size=vocab)
    ids = np.array([[2, 0, 5], [1, 2, 3]])
    logps = np.sort(np.log(rng.dirichlet(np.ones(3), size=2)), axis=1)[:, ::-1]
    tree = build_ddtree(0, ids, logps, 7)
    assert max(tree.depths) == 2
    n = 20000
    counts = np.zeros(vocab * vocab)
    for _ in range(n):
        acc, bonus = sample_walk(tree, lambda v: second[tree.tokens[v]] if v else first, rng)
        seq = [tree.tokens[v] for v in acc] + [bonus]
        if len(seq) == 1:  # rejected at the root: the second token comes from the target itself
            seq.append(int(rng.choice(vocab, p=second[seq[0]])))
        counts[seq[0] * vocab + seq[1]] += 1
    assert chi2_pvalue_ok(counts, (first[:, None] * second).ravel(), n)


def test_ddtree_sampling_preserves_the_target_distribution():
    """End to end at temperature > 0, as tests/test_sampling_e2e.py does for the TreeGraft trees."""
    check_two_token_joint("ddtree", block=BlockConfig(budget=6, topk=3, k=2))
