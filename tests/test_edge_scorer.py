"""TDES at run time and in training: the DDTree edge-score hook, the exported scorer's files, losslessness,
and a scorer fitted on a separable synthetic edge set."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from conftest import noisy_copy, tiny_model
from test_lossless import EOS, prompts, reference
from test_sampling import chi2_pvalue_ok
from test_sampling_e2e import PROMPT, V, exact_joint

from config.params import load_params
from decoder.core.config import BlockConfig, DecodeConfig
from decoder.generate import generate
from decoder.graft.ddtree import best_scored_prefixes, build_ddtree
from decoder.graft.edge_scorer import EdgeScorer, EdgeScorerError, load_edge_scorer, save_edge_scorer
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair
from models.edge_metrics import edge_auc
from models.edge_scorer_fit import edge_data, export_scorer, fit_tdes


def marginals(rng: np.random.Generator, k: int, m: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.stack([rng.choice(vocab, size=m, replace=False) for _ in range(k)]).astype(np.int64)
    raw = rng.normal(size=(k, vocab))
    logp = raw - np.logaddexp.reduce(raw, axis=1, keepdims=True)
    vals = -np.sort(-np.take_along_axis(logp, ids, axis=1), axis=1)
    return ids, vals


def random_scorer(rng: np.random.Generator, vocab: int, k: int, h: int = 8, scale: float = 2.0) -> EdgeScorer:
    return EdgeScorer(
        parent_table=rng.normal(size=(vocab, h)),
        child_table=rng.normal(size=(vocab, h)),
        depth_table=rng.normal(size=(k, h)),
        w=rng.normal(size=h),
        b0=0.1,
        scale=scale,
    )


def tree_shape(tree) -> list[tuple[int, int]]:
    return list(zip(tree.tokens, tree.parents, strict=True))


def test_edge_scores_equal_to_the_marginals_build_the_default_tree() -> None:
    rng = np.random.default_rng(0)
    for budget in (1, 7, 40, 200):
        ids, logps = marginals(rng, 4, 4, 50)
        plain = build_ddtree(3, ids, logps, budget)
        hooked = build_ddtree(3, ids, logps, budget, edge_scores=lambda d, p, i, lp: lp)
        assert tree_shape(hooked) == tree_shape(plain)
        assert hooked.scores == plain.scores


def test_parent_aware_heap_pops_the_best_prefixes_of_a_brute_force() -> None:
    """Every prefix scored by summed parent-dependent edge scores; the heap's pops are the top B."""
    rng = np.random.default_rng(1)
    k, m = 3, 3
    for trial in range(20):
        ids, logps = marginals(rng, k, m, 30)
        table = {}

        def edge(d: int, parent: int, row_ids, row_logps, table=table) -> np.ndarray:
            return table.setdefault((d, parent), -rng.exponential(size=m))

        budget = int(rng.integers(1, 39))
        got = best_scored_prefixes(5, ids, logps, budget, edge)
        every = {}
        for depth in range(1, k + 1):
            for cand in itertools.product(range(m), repeat=depth):
                parents = [5] + [int(ids[j, cand[j]]) for j in range(depth - 1)]
                every[cand] = sum(float(edge(j + 1, parents[j], None, None)[cand[j]]) for j in range(depth))
        best = sorted(every.values(), reverse=True)[:budget]
        assert np.allclose([s for _, s, _ in got], best), trial
        popped = {c for c, _, _ in got}
        assert all(c[:-1] in popped or len(c) == 1 for c in popped), "not prefix-closed"


def test_edge_scores_above_zero_are_refused() -> None:
    ids, logps = marginals(np.random.default_rng(2), 2, 3, 20)
    with pytest.raises(ValueError, match="edge_scores at depth 1"):
        build_ddtree(0, ids, logps, 4, edge_scores=lambda d, p, i, lp: np.full(3, 0.5))


def test_a_scorer_with_f_zero_reproduces_the_marginal_tree_and_a_random_one_reorders() -> None:
    rng = np.random.default_rng(3)
    ids, logps = marginals(rng, 4, 5, 60)
    flat = random_scorer(rng, 60, 4)
    flat = EdgeScorer(flat.parent_table, flat.child_table, flat.depth_table, np.zeros(8), 0.0, 1.0)
    plain = build_ddtree(7, ids, logps, 20)
    same = build_ddtree(7, ids, logps, 20, edge_scores=flat.for_round(7, ids, logps))
    assert tree_shape(same) == tree_shape(plain)
    assert np.allclose(same.scores, plain.scores)
    other = build_ddtree(7, ids, logps, 20, edge_scores=random_scorer(rng, 60, 4).for_round(7, ids, logps))
    assert tree_shape(other) != tree_shape(plain)
    assert max(other.scores[1:]) <= 0


def test_the_round_grid_builds_the_tree_that_scoring_each_parent_on_the_fly_builds() -> None:
    """for_round scores and sorts the whole round once and the heap looks rows up by the parent's
    candidate index; scoring each popped parent's children through f instead (the callable form,
    looked up by the parent's token) must pop the same nodes with the same edge scores."""
    rng = np.random.default_rng(11)
    for trial in range(30):
        k, m = 4, 5
        scorer = random_scorer(rng, 60, k)
        ids, logps = marginals(rng, k, m, 60)

        def on_the_fly(d: int, parent: int, row_ids, row_logps, scorer=scorer) -> np.ndarray:
            z = row_logps + scorer.scale * scorer.f(d, np.array([parent]), row_ids)[0]
            mass = min(float(np.logaddexp.reduce(row_logps)), 0.0)
            return np.minimum(z - np.logaddexp.reduce(z) + mass, 0.0)

        budget = int(rng.integers(1, 60))
        grid = build_ddtree(7, ids, logps, budget, edge_scores=scorer.for_round(7, ids, logps))
        fly = build_ddtree(7, ids, logps, budget, edge_scores=on_the_fly)
        assert tree_shape(grid) == tree_shape(fly), trial
        np.testing.assert_allclose(grid.edge_logp, fly.edge_logp, atol=1e-9)


def test_a_grid_of_another_shape_is_refused() -> None:
    rng = np.random.default_rng(12)
    ids, logps = marginals(rng, 4, 5, 60)
    grid = random_scorer(rng, 60, 4).for_round(7, ids[:3], logps[:3])
    with pytest.raises(ValueError, match="edge grid: 3 depths of 5 candidates, the marginals have 4 of 5"):
        build_ddtree(7, ids, logps, 10, edge_scores=grid)


@pytest.fixture()
def saved(tmp_path: Path) -> tuple[Path, EdgeScorer]:
    scorer = random_scorer(np.random.default_rng(4), 40, 4)
    save_edge_scorer(tmp_path, scorer, "tiny", "block-tiny")
    return tmp_path, scorer


def test_save_load_round_trip_scores_alike(saved) -> None:
    folder, scorer = saved
    loaded, manifest = load_edge_scorer(folder, vocab_size=40, k=4)
    assert manifest["pair_id"] == "tiny" and manifest["drafter_id"] == "block-tiny"
    ids, logps = marginals(np.random.default_rng(5), 4, 4, 40)
    a, b = scorer.for_round(1, ids, logps), loaded.for_round(1, ids, logps)
    for d in range(4):
        np.testing.assert_allclose(a.rows[d], b.rows[d], atol=1e-5)


def edit_manifest(folder: Path, **fields) -> None:
    path = folder / "edge_scorer.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"scale": 3.0}, "field 'manifest_sha256' does not match"),
        ({"scale": -1.0}, "field 'scale' has a bad value"),
        ({"extra": 1}, "field 'extra' is unknown"),
        ({"schema_version": "treegraft-edge-scorer/0"}, "field 'schema_version'"),
    ],
)
def test_edited_manifests_are_refused_naming_file_and_field(saved, edit, message) -> None:
    folder, _ = saved
    edit_manifest(folder, **edit)
    with pytest.raises(EdgeScorerError, match=message) as err:
        load_edge_scorer(folder)
    assert "edge_scorer.json" in str(err.value)


def test_edited_weights_a_missing_field_and_another_vocabulary_are_refused(saved) -> None:
    folder, _ = saved
    with pytest.raises(EdgeScorerError, match="field 'vocab_size' is 40, the runtime needs 41"):
        load_edge_scorer(folder, vocab_size=41)
    with pytest.raises(EdgeScorerError, match="field 'k' is 4, the runtime needs 8"):
        load_edge_scorer(folder, k=8)
    weights = folder / "edge_scorer.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(EdgeScorerError, match="field 'weights_sha256' does not match"):
        load_edge_scorer(folder)
    manifest = json.loads((folder / "edge_scorer.json").read_text())
    del manifest["b0"]
    (folder / "edge_scorer.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgeScorerError, match="field 'b0' is missing"):
        load_edge_scorer(folder)


def test_greedy_decoding_with_the_scorer_is_token_identical_to_the_target() -> None:
    """Rounds of CausalLMProposer marginals -> DDTree with a (random, tree-reordering) scorer -> the
    verifier; the committed text must be the target's own greedy continuation."""
    target = tiny_model("llama", seed=21)
    pair = make_pair(target, noisy_copy(target, noise=0.3, seed=22), eos_token_ids=(EOS,))
    k, n_new = 4, 30
    scorer = random_scorer(np.random.default_rng(6), pair.vocab_size, k, scale=3.0)
    reordered = 0
    config = DecodeConfig(max_new_tokens=n_new, block=BlockConfig(k=k, topk=4, budget=12))
    for prompt in prompts(pair.vocab_size, 2, seed=9):
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, k)
        res = generate(pair, prompt, "ddtree", config, proposer=proposer, edge_scorer=scorer)
        plain = generate(pair, prompt, "ddtree", config, proposer=proposer)
        reordered += sum(r.accepted for r in res.rounds) != sum(r.accepted for r in plain.rounds)
        want = reference(pair.target, prompt, n_new)
        assert res.new_tokens[: len(want)] == want and plain.new_tokens[: len(want)] == want
        # the scorer reorders the trees themselves (checked round by round on a fresh proposal)
        marg = proposer.propose(None, prompt, 4)
        edges = scorer.for_round(prompt[-1], marg.ids, marg.logps)
        tree = build_ddtree(prompt[-1], marg.ids, marg.logps, 12, pair.vocab_size, edges)
        reordered += tree_shape(tree) != tree_shape(build_ddtree(prompt[-1], marg.ids, marg.logps, 12))
    assert reordered > 0, "the scorer never changed a tree: the test would not see a wrong hook"


def test_sampling_with_the_scorer_keeps_the_targets_two_token_joint() -> None:
    """Temperature > 0, DDTree ranked by a tree-reordering scorer: the sampler treats the drafted
    children as point-mass proposals (decoder/core/sampling.py) and never reads their edge log-probs as a
    proposal q, so edge scores in the tree's edge_logp (only the sibling order) keep it exact. The
    joint of two sampled tokens must pass the chi-square test against the target's own."""
    target = tiny_model("llama", seed=31, vocab=V, logit_scale=1.5)
    pair = make_pair(target, noisy_copy(target, 0.2, seed=32), eos_token_ids=())
    block = BlockConfig(budget=6, topk=3, k=2)
    scorer = random_scorer(np.random.default_rng(8), V, 2, scale=4.0)
    marg = CausalLMProposer(pair.mid, V, 2).propose(None, PROMPT, 3)
    edges = scorer.for_round(PROMPT[-1], marg.ids, marg.logps)
    ranked = build_ddtree(PROMPT[-1], marg.ids, marg.logps, 6, V, edges)
    assert tree_shape(ranked) != tree_shape(build_ddtree(PROMPT[-1], marg.ids, marg.logps, 6, V))
    temperature, n = 0.8, 1500
    counts = np.zeros(V * V)
    accepted = 0
    for seed in range(n):
        cfg = DecodeConfig(max_new_tokens=2, temperature=temperature, seed=seed, block=block)
        res = generate(pair, PROMPT, "ddtree", cfg, timing=False, edge_scorer=scorer)
        a, b = res.new_tokens
        counts[a * V + b] += 1
        accepted += res.rounds[0].accepted
    assert accepted > n // 4, "drafts were rarely accepted: the test would only check residual draws"
    assert chi2_pvalue_ok(counts, exact_joint(target, temperature), n)


def synthetic_edges(rng: np.random.Generator, n_groups: int, classes: np.ndarray, m: int = 4) -> pl.DataFrame:
    """Edges whose label is "the child's class equals the parent's" (one such child per sibling set),
    with log q unrelated to it: only a parent-aware score can separate them."""
    by_class = [np.flatnonzero(classes == c) for c in range(m)]
    rows = []
    for g in range(n_groups):
        parent = int(rng.integers(len(classes)))
        children = [int(rng.choice(by_class[c])) for c in rng.permutation(m)]
        logq = np.sort(rng.uniform(-4, -0.5, size=m))[::-1]
        for r, c in enumerate(children):
            hit = bool(classes[c] == classes[parent])
            rows.append({"dataset_id": "syn", "prompt_id": g, "round_id": 0, "depth": 1, "parent_node": 0,
                         "parent_token": parent, "child_token": c, "child_rank": r, "logq": float(logq[r]),
                         "is_accepted_parent": True, "is_target": hit,
                         "target_logit": 4.0 if hit else 0.0})  # fmt: skip
    return pl.DataFrame(rows)


def test_a_scorer_fitted_on_a_separable_edge_set_beats_the_unary_baseline() -> None:
    rng = np.random.default_rng(7)
    vocab, m = 40, 4
    classes = np.arange(vocab) % m
    emb = torch.tensor(np.eye(m)[classes] * 2 + 0.1 * rng.normal(size=(vocab, m)), dtype=torch.float32)
    cfg = load_params().edges
    train, test = synthetic_edges(rng, 300, classes), synthetic_edges(rng, 100, classes)
    fit = fit_tdes(edge_data(train), emb, 1, cfg, seed=0)
    assert fit.losses[-1] < fit.losses[0]
    scorer = export_scorer(fit.net)
    f = scorer.f(1, test["parent_token"].to_numpy(), test["child_token"].to_numpy()).diagonal()
    z = test["logq"].to_numpy() + scorer.scale * f
    labels = test["is_target"].to_numpy()
    assert edge_auc(test["logq"].to_numpy(), labels) < 0.7
    assert edge_auc(z, labels) > 0.95
