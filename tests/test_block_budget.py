"""GRAFT's learned per-round budget: the prefix property it rests on, its decisions at the cost
extremes, lossless decoding under it, the exact walk of it, and the node acceptance fit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import noisy_copy, tiny_model
from test_graft_eval import priced_costs, scorer_for
from test_lossless import EOS, prompts, reference

from collectors.graft.budget import learned_budget
from collectors.graft.walk import BudgetWalker, decode_arm, lossless_gate
from decoder.core.config import BlockBudgetRule
from decoder.core.verify import TargetVerifier
from decoder.graft.budget import NODE_FEATURES, first_nodes, node_features, rule_budget, rule_gains
from decoder.graft.ddtree import build_ddtree
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair
from models.budget_rule import cross_fitted_speedups, fit_budget_rule
from models.gain_fit import fit_logistic

M, K = 4, 4


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=41)
    return make_pair(target, noisy_copy(target, noise=0.3, seed=42), eos_token_ids=(EOS,))


def random_marginals(rng: np.random.Generator, k: int, m: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.stack([rng.choice(vocab, size=m, replace=False) for _ in range(k)])
    logits = rng.normal(scale=2.0, size=(k, m + 3))
    logps = np.sort(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), axis=1)[:, ::-1][:, :m]
    return ids, np.ascontiguousarray(logps)


def tree_rows(tree) -> list[tuple[int, int, float]]:
    return list(zip(tree.tokens, tree.parents, tree.edge_logp, strict=True))


@pytest.mark.parametrize("tdes", [False, True])
def test_the_first_b_nodes_of_the_cap_tree_are_the_tree_of_budget_b(tdes: bool) -> None:
    """What the rule and its walk rest on: a DDTree built at the cap, cut to its first B nodes, is
    the DDTree built at B (with TDES's parent-aware scores too)."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        ids, logps = random_marginals(rng, 4, 3, 50)
        edges = scorer_for(50, 4, seed=trial).for_round(7, ids, logps) if tdes else None
        cap = build_ddtree(7, ids, logps, 40, 50, edges)
        for b in range(0, 41):
            assert tree_rows(first_nodes(cap, b)) == tree_rows(build_ddtree(7, ids, logps, b, 50, edges)), b


def rule_with(cost_ms, weights=(1.0, 0.0, 0.0, 0.0), bias: float = 0.0, rate: float = 1.0) -> BlockBudgetRule:
    return BlockBudgetRule(weights, bias, tuple(cost_ms), rate)


def test_free_nodes_verify_the_cap_and_dear_nodes_the_root_alone() -> None:
    rng = np.random.default_rng(0)
    ids, logps = random_marginals(rng, 4, 4, 50)
    tree = build_ddtree(1, ids, logps, 12, 50)
    flat = rule_with([5.0] * 13)  # every budget costs the same: more expected tokens always win
    assert rule_budget(tree, float(logps[0, 0]), 0, 4, flat) == 12
    dear = rule_with([1.0 + 100.0 * b for b in range(13)])  # a node costs 100 round trips
    assert rule_budget(tree, float(logps[0, 0]), 0, 4, dear) == 0
    # a node pays iff its acceptance chance beats rate x its ms: p ~ 1 against 0.5 ms at rate 1
    sure = rule_with([1.0 + 0.5 * b for b in range(13)], weights=(0.0,) * 4, bias=30.0)
    assert rule_budget(tree, float(logps[0, 0]), 0, 4, sure) == 12
    gains = rule_gains(tree, float(logps[0, 0]), 0, 4, sure)
    assert gains[0] == 0 and np.allclose(np.diff(gains), 1.0)


def test_the_decision_takes_the_budget_of_the_most_tokens_less_their_price() -> None:
    """rule_budget picks a B whose 1 + G(B) - rate x cost_ms[B] (G from the node probabilities,
    rule_gains) is the largest, over random trees (some shorter than the cap), weights, histories
    and cost curves that are not monotone; both the cap and smaller budgets get chosen."""
    rng = np.random.default_rng(11)
    chosen = set()
    for _ in range(400):
        k, m = int(rng.integers(1, 7)), int(rng.integers(1, 4))
        ids, logps = random_marginals(rng, k, m, 30)
        tree = build_ddtree(2, ids, logps, int(rng.integers(0, 30)), 30)
        cap = int(rng.integers(1, 30))
        cost = 1.0 + np.abs(np.cumsum(rng.normal(0.05, 0.2, size=cap + 1)))
        rule = BlockBudgetRule(
            tuple(rng.normal(0.0, 2.0, size=4)), float(rng.normal()), tuple(cost), float(rng.random())
        )
        first, prev = float(logps[0, 0]), int(rng.integers(0, k + 1))
        objective = 1.0 + rule_gains(tree, first, prev, k, rule) - rule.rate * cost
        b = rule_budget(tree, first, prev, k, rule)
        assert 0 <= b <= cap and objective[b] >= objective.max() - 1e-9
        chosen.add(b == cap)
    assert chosen == {True, False}


def test_a_rule_refuses_bad_fields() -> None:
    with pytest.raises(ValueError, match="finite"):
        rule_with([1.0, 2.0], weights=(float("nan"), 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="cap >= 1"):
        rule_with([1.0])
    with pytest.raises(ValueError, match="> 0 ms"):
        rule_with([1.0, 0.0])
    tree = build_ddtree(1, *random_marginals(np.random.default_rng(1), 2, 2, 9), 3, 9)
    with pytest.raises(ValueError, match="weights"):
        rule_budget(tree, -0.1, 0, 2, rule_with([1.0, 2.0], weights=(1.0, 0.0)))


def varied_rule(cap: int) -> BlockBudgetRule:
    """A rule whose budget moves with the round's scores and history on the tiny pair."""
    return rule_with([1.0 + 0.05 * b for b in range(cap + 1)], weights=(0.5, 0.0, 0.0, 1.0), bias=0.0)


@pytest.mark.parametrize("tdes", [False, True])
def test_decoding_under_a_rule_is_lossless_and_its_walk_is_exact(pair, tdes: bool) -> None:
    """generate(..., "ddtree") under a rule emits the target's greedy tokens, the budget moves from
    round to round, and the walk of that output under the rule is decoding's round sequence."""
    scorer = scorer_for(pair.vocab_size, K, seed=5) if tdes else None
    rule = varied_rule(16)
    sizes = set()
    for prompt in prompts(pair.vocab_size, 2, seed=23):
        run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), scorer, prompt, 1, M, 30, rule)
        assert run.tokens == reference(pair.target, prompt, 30)
        feats = lossless_gate(pair, prompt, run.tokens, ())
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
        walker = BudgetWalker(proposer, prompt, run.tokens, feats, 20, M, pair.vocab_size, scorer)
        assert walker.ruled(rule) == run.rounds
        sizes |= {r.nodes for r in run.rounds}
    assert len(sizes) >= 3 and max(sizes) <= 16, sizes


def test_a_round_left_with_the_root_alone_runs_as_the_autoregressive_step(pair, monkeypatch) -> None:
    """Under a rule that finds every node too dear (B_t = 0 each round), no bare root goes to the
    tree verify: each round is the target's one-token step, and the output is still greedy."""
    bare = []
    verify = TargetVerifier.verify

    def spy(self, tree, temperature, rng):
        bare.append(len(tree) == 1)
        return verify(self, tree, temperature, rng)

    monkeypatch.setattr(TargetVerifier, "verify", spy)
    dear = rule_with([1.0 + 100.0 * b for b in range(9)])
    prompt = prompts(pair.vocab_size, 1, seed=29)[0]
    run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, 1, M, 12, dear)
    assert run.tokens == reference(pair.target, prompt, 12)
    assert {r.nodes for r in run.rounds} == {0} and len(run.rounds) == len(run.tokens) - 1
    assert not any(bare)  # the step ran instead (the first verify call would be a bare root)


def test_node_rows_label_each_start_by_its_accepted_path(pair) -> None:
    """A start's labelled nodes are exactly its accepted drafted tokens under the largest tree, and
    the features are the tree's (score, depth / K) with the walk's acceptance history."""
    prompt = prompts(pair.vocab_size, 1, seed=29)[0]
    run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, 8, M, 30)
    feats = lossless_gate(pair, prompt, run.tokens, ())
    walker = BudgetWalker(CausalLMProposer(pair.mid, pair.vocab_size, K), prompt, run.tokens, feats, 12, M,
                          pair.vocab_size)  # fmt: skip
    x, y = walker.node_rows(5)
    n, prev, row = len(prompt) + 1, 0, 0  # the first round starts after the prefill's token
    for r in walker.fixed(5):
        sw = walker.start(n)
        count = min(12, len(sw.tree) - 1)
        assert int(y[row : row + count].sum()) == int(sw.accepted[12])
        assert np.array_equal(x[row : row + count], node_features(sw.tree, 12, sw.first_logp, prev, sw.k))
        assert np.all(x[row : row + count, 3] == prev / K)
        prev, row, n = int(sw.accepted[5]), row + count, n + r.emitted
    assert row == len(y) and len(NODE_FEATURES) == x.shape[1]


def test_the_logistic_fit_recovers_its_model_and_matches_acceptance_in_sample() -> None:
    rng = np.random.default_rng(11)
    x = np.column_stack([rng.normal(-3, 2, 40000), rng.uniform(0, 1, 40000), rng.normal(0, 5, 40000)])
    true_w, true_b = np.array([1.2, -2.0, 0.1]), 0.5
    y = (rng.uniform(size=len(x)) < 1 / (1 + np.exp(-(x @ true_w + true_b)))).astype(float)
    w, b = fit_logistic(x, y, l2=0.0)
    assert np.allclose(w, true_w, atol=0.08) and abs(b - true_b) < 0.1
    # with an unpenalised intercept the fitted chances sum to the observed acceptances
    w2, b2 = fit_logistic(x, y, l2=0.1)
    p = 1 / (1 + np.exp(-(x @ w2 + b2)))
    assert abs(p.sum() - y.sum()) < 1e-6 * len(y)
    assert np.linalg.norm(w2 * x.std(0)) < np.linalg.norm(w * x.std(0))  # the penalty shrinks
    # one class has no finite fit: zero weights and the smoothed constant rate (k + 1/2) / (n + 1)
    for labels, rate in ((np.zeros(10), 0.5 / 11), (np.ones(10), 10.5 / 11)):
        w0, b0 = fit_logistic(x[:10], labels)
        assert not w0.any() and abs(1 / (1 + np.exp(-b0)) - rate) < 1e-12


def test_cross_fitting_on_two_copies_of_the_same_prompts_is_the_in_sample_choice(pair) -> None:
    """Each group's budget comes from the other group only: with two identical groups that is the
    in-sample choice, so both out-of-fold speedups equal the in-sample ones."""
    costs = priced_costs(((1, 1.0), (4, 1.3), (21, 3.0)))
    walkers = []
    for prompt in prompts(pair.vocab_size, 3, seed=31):
        run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, 8, M, 30)
        feats = lossless_gate(pair, prompt, run.tokens, ())
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
        walkers.append(BudgetWalker(proposer, prompt, run.tokens, feats, 20, M, pair.vocab_size))

    def price(r) -> float:
        return costs.round_ms(r.nodes, False, False)

    budget, curve = learned_budget(walkers, price, costs.ar_token_ms, 20)
    _, summary = fit_budget_rule(walkers, budget, curve[budget - 1], costs, False, [4, 20], 1e-3)
    fixed, ruled = cross_fitted_speedups([walkers, walkers], costs, False, [4, 20], 1e-3, 20)
    assert fixed == pytest.approx(curve[budget - 1]) and ruled == pytest.approx(summary["collect_speedup"])
    with pytest.raises(ValueError, match=">= 2 non-empty groups"):
        cross_fitted_speedups([walkers], costs, False, [4, 20], 1e-3, 20)
