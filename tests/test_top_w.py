"""top_w, the frontier/preview ranking every drafting step and every scheduler decision uses: best
path score first, ties shallower first, then older first, on pools in any order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.core.tree import DraftTree, top_w


def _tree(parents_pick: list[int], logps: list[float]) -> DraftTree:
    tree = DraftTree(7)
    for i, (pick, logp) in enumerate(zip(parents_pick, logps, strict=True)):
        parent = pick % len(tree)
        tree.add_child(parent, 100 + i, logp)  # a fresh token per node: every add creates a node
    return tree


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=60).flatmap(
        lambda picks: st.tuples(
            st.just(picks),
            st.lists(st.sampled_from([-0.5, -1.0, -0.25, 0.0]), min_size=len(picks), max_size=len(picks)),
            st.permutations(range(len(picks) + 1)),
            st.integers(0, 12),
        )
    )
)
def test_top_w_is_the_score_depth_age_order(case) -> None:
    picks, logps, order, width = case
    tree = _tree(picks, logps)  # few distinct edge log-probs: many tied path scores across depths
    pool = list(order)[: max(1, len(order) // 2)]  # a subset, shuffled
    want = sorted(pool, key=lambda v: (-tree.scores[v], tree.depths[v], v))[:width]
    assert top_w(tree, pool, width) == want
    assert pool == list(order)[: max(1, len(order) // 2)]  # the caller's pool is left as it was
