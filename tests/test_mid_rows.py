"""The mid drafter's rows: equal to a fresh full forward, and lazy normalization changes no bit."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model

from decoder.core.mid import WALK_NODES, MidDrafter, TreeScores, tree_query
from decoder.core.tree import DraftTree

VOCAB = 96


def grow(tree: DraftTree, n: int, rng: random.Random) -> None:
    """Add n nodes under random live nodes."""
    target = len(tree) + n
    while len(tree) < target:
        live = tree.live_nodes()
        tree.add_child(rng.choice(live), rng.randrange(VOCAB), -rng.random())


def fresh_logp(model, tokens: list[int]) -> torch.Tensor:
    """Next-token log-probs after `tokens`, from a forward of the whole sequence with no cache."""
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0, -1].float(), -1)


@pytest.mark.parametrize(("arch", "lazy"), [("qwen3", False), ("llama", False), ("qwen3", True)])
def test_every_fed_row_and_edge_equals_a_fresh_full_forward(arch, lazy):
    model = tiny_model(arch, seed=11)
    rng = random.Random(3)
    committed = [rng.randrange(1, VOCAB) for _ in range(40)]
    drafter = MidDrafter(model, VOCAB)
    assert not drafter.lazy_rows  # a small fp32 vocabulary: rows normalized as they come
    drafter.lazy_rows = lazy
    for _ in range(3):  # rounds: catch-up, two calls on a growing tree, then the accepted path kept
        tree = DraftTree(committed[-1])
        grow(tree, 9, rng)
        drafter.rescore(tree, committed)
        grow(tree, 14, rng)
        call = drafter.rescore(tree, committed)
        assert call.n_tree_nodes == 14
        rows = drafter.scores.logp
        assert rows is not None and rows.shape == (len(drafter.scores.fed), VOCAB)
        for v in drafter.scores.fed:  # leaves too: their rows are normalized only when read here
            expect = fresh_logp(model, committed + tree.path_tokens(v))
            torch.testing.assert_close(rows[drafter.scores.row[v]], expect, atol=2e-5, rtol=0)
        for v in range(1, len(tree)):
            expect = fresh_logp(model, committed + tree.path_tokens(tree.parents[v]))[tree.tokens[v]]
            assert tree.edge_logp[v] == pytest.approx(float(expect), abs=2e-5)
            assert tree.scores[v] == pytest.approx(tree.scores[tree.parents[v]] + tree.edge_logp[v], abs=1e-9)
        ids, vals = drafter.top_children([0, 5], 4)
        for v, got_ids, got_vals in zip([0, 5], ids, vals, strict=True):
            top = torch.topk(fresh_logp(model, committed + tree.path_tokens(v)), 4)
            assert got_ids == top.indices.tolist()
            assert got_vals == pytest.approx(top.values.tolist(), abs=2e-5)
        accepted = tree.path(max(range(1, len(tree)), key=lambda u: (tree.depths[u], -u)))[:3]
        drafter.end_round(accepted)
        committed = committed + [tree.tokens[a] for a in accepted] + [rng.randrange(1, VOCAB)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lazy_rows_are_bit_identical_to_a_batched_log_softmax(dtype):
    torch.manual_seed(0)
    rng = random.Random(5)
    tree = DraftTree(7)
    grow(tree, 30, rng)
    first, second = tree.live_nodes()[:12], tree.live_nodes()[12:]
    logits = (4 * torch.randn(len(tree), VOCAB)).to(dtype)
    eager, lazy = TreeScores(), TreeScores()
    eager.record(first, torch.log_softmax(logits[:12].float(), -1))
    eager.record(second, torch.log_softmax(logits[12:].float(), -1))
    lazy.record_logits(first, logits[:12])
    branch = lazy.copy()  # copies share the rows; one reading a row normalizes it for both
    assert branch.top_children([3], 2) == eager.top_children([3], 2)
    lazy.record_logits(second, logits[12:])
    branch.record_logits(second, logits[12:])
    frontier = [3, 17, 0, 29, 3]
    expect_ids, expect_vals = eager.top_children(frontier, 6)
    for scores in (lazy, branch):
        a, b = tree.copy(), tree.copy()
        eager.apply_edges(a)
        scores.apply_edges(b)
        assert a.edge_logp == b.edge_logp and a.scores == b.scores
        assert scores.top_children(frontier, 6) == (expect_ids, expect_vals)
        assert torch.equal(scores.logp, eager.logp)


@pytest.mark.parametrize("size", [12, 90])
def test_tree_query_sees_exactly_each_new_nodes_ancestors(size):
    rng = random.Random(8)
    tree = DraftTree(1)
    grow(tree, size, rng)
    tree.remove_children(tree.parents[size // 2])  # dead nodes: never fed, never seen
    live = tree.live_nodes()
    assert len(live) > WALK_NODES or size < WALK_NODES  # blocks on both sides of WALK_NODES below
    for split in sorted({0, 1, 9, max(0, len(live) - WALK_NODES), len(live) - 1} & set(range(len(live)))):
        fed, new = live[:split], live[split:]
        block = tree_query(tree, fed, new, prefix_len=50)
        cols = fed + new
        assert block.tokens == [tree.tokens[v] for v in new]
        assert block.positions.tolist() == [50 + tree.depths[v] for v in new]
        for i, v in enumerate(new):
            ancestors = {0, *tree.path(v)}
            assert [bool(x) for x in block.visible[i]] == [u in ancestors for u in cols]
