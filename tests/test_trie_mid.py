"""The round trie gives every branch the mid rows a batched per-branch forward gives it, forwarding
each distinct token path once."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache

from collectors.collect.branch_mid import BranchMid, batch_rescore, committed_kv
from collectors.collect.trie_mid import RoundTrie, TrieBranchMid
from decoder.core.mid import TreeScores
from decoder.core.tensors import causal_block, forward_block
from decoder.core.tree import DraftTree

VOCAB = 96


def _grow(tree: DraftTree, parent: int, tokens: list[int]) -> None:
    for t in tokens:
        parent, _ = tree.add_child(parent, t, -1.0)


def _branches() -> list[DraftTree]:
    """Three trees from one root that share a trunk and differ in their leaves."""
    base = DraftTree(7)
    _grow(base, 0, [11, 12, 13])
    _grow(base, 0, [21, 22])
    a, b, c = base.copy(), base.copy(), base.copy()
    _grow(a, 3, [31, 32])
    _grow(b, 3, [31, 33])  # shares 31 with a, then differs
    _grow(c, 5, [41])
    return [a, b, c]


@pytest.fixture(scope="module")
def mid():
    model = tiny_model("qwen3", seed=91)
    text = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    cache = DynamicCache()
    forward_block(model, cache, causal_block(text, 0, 0))
    return model, committed_kv(cache, len(text))


def _rows(scores: TreeScores) -> dict[int, torch.Tensor]:
    assert scores.logp is not None
    return {v: scores.logp[scores.row[v]] for v in scores.fed}


def test_trie_rows_and_charges_equal_a_forward_per_branch(mid) -> None:
    model, context = mid
    n = context[0][0].shape[2]
    trees = _branches()
    trie = RoundTrie(model, VOCAB, context, n)
    shared = [TrieBranchMid(TreeScores()) for _ in trees]
    alone = [BranchMid(TreeScores()) for _ in trees]
    for step in range(2):  # the second call reuses the KV of the nodes fed by the first
        if step == 1:
            for t in trees:
                _grow(t, len(t) - 1, [51, 52])
        trie.rescore(list(zip(trees, shared, strict=True)))
        batch_rescore(model, VOCAB, context, n, list(zip(trees, alone, strict=True)))
        for s, a in zip(shared, alone, strict=True):
            assert s.pending == a.pending > 0  # charged for all of its own unseen nodes
            assert s.scores.fed == a.scores.fed
            got, want = _rows(s.scores), _rows(a.scores)
            for v in want:
                torch.testing.assert_close(got[v], want[v], atol=2e-5, rtol=1e-5)
    fed = sum(len(s.scores.fed) for s in shared)
    distinct = {tuple(t.path_tokens(v)) for t in trees for v in range(len(t))}
    assert len(trie) == len(distinct) < fed  # one forward per distinct path, fewer than per branch


def test_a_copied_branch_keeps_its_trie_nodes_and_the_parent_is_untouched(mid) -> None:
    model, context = mid
    tree = _branches()[0]
    trie = RoundTrie(model, VOCAB, context, context[0][0].shape[2])
    parent = TrieBranchMid(TreeScores())
    trie.rescore([(tree, parent)])
    child = parent.copy()
    grown = tree.copy()
    _grow(grown, len(grown) - 1, [61])
    trie.rescore([(grown, child)])
    assert child.pending == 1 and parent.pending == len(tree)
    assert set(child.trie_node) == set(range(len(grown))) and set(parent.trie_node) == set(range(len(tree)))
    with pytest.raises(TypeError, match="TrieBranchMid"):
        trie.rescore([(tree, BranchMid(TreeScores()))])
