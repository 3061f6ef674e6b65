"""Tree construction rules: extended and non-destructive grafting, overwrite, sequential cascade."""

from __future__ import annotations

from decoder.core.config import Grafting, TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.mid import MidCall
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import FixedSchedule
from decoder.core.timing import zero_times


class FakeMid:
    """Scores every edge -1 and proposes tokens 10.., one more per depth, in a fixed order."""

    def __init__(self) -> None:
        self.frontiers: list[list[int]] = []

    def rescore(self, tree, committed) -> MidCall:
        tree.set_edge_logps(tree.live_nodes(), [-1.0] * len(tree.live_nodes()))
        return MidCall(0, len(tree))

    def top_children(self, nodes, m):
        self.frontiers.append(list(nodes))
        return [[10 + i for i in range(m)] for _ in nodes], [
            [-0.1 * (i + 1) for i in range(m)] for _ in nodes
        ]


def build(schedule: str, committed: list[int], **cfg):
    config = TreeConfig(**cfg)
    ngram = NgramDrafter.for_tree(config)
    ngram.commit(committed)
    ngram.cache.set_rows(0, [[t] for t in committed[1:]], [[-0.5]] * (len(committed) - 1))
    mid = FakeMid()
    builder = RoundBuilder(config, ngram, mid, lambda: 0.0)
    bits = FixedSchedule(tuple(c == "1" for c in schedule))
    tree, records = builder.build(committed, bits, zero_times())
    return tree, records, mid


def test_mid_pool_is_every_unvisited_node_and_never_the_root_again():
    _, records, mid = build("11", [1, 2, 3], depth=2, width=3, topk=2)
    assert mid.frontiers[0] == [0]
    assert 0 not in mid.frontiers[1]
    assert records[1].pool_size == 2  # the two children of the root, not the visited root


def test_small_steps_only_expand_the_newest_nodes_and_merge_same_tokens():
    committed = [5, 6, 7, 5, 6, 7, 5, 6]
    tree, records, _ = build("00", committed, depth=2, width=10, topk=10, ngram_chain_len=2)
    # step 1 grafts the chain 7 5; step 2 expands both new nodes (never the root again): "7" proposes
    # 5 6 (5 merges, 6 is new) and "7 5" proposes 6, which merges with the node just made
    assert records[0].frontier_size == 1 and records[0].created == 2
    assert records[1].frontier_size == 2 and records[1].historical_picks == 0 and records[1].created == 1
    assert [tree.path_tokens(v) for v in tree.live_nodes()] == [[], [7], [7, 5], [7, 5, 6]]


def test_overwrite_replaces_children_and_non_destructive_keeps_them():
    committed = [5, 6, 7, 5, 6, 7, 5, 6]  # step 1 (n-gram) grafts 7 5 6 under the root
    keep, _, _ = build("01", committed, depth=2, width=1, topk=2, ngram_chain_len=4)
    over, _, _ = build(
        "01", committed, depth=2, width=1, topk=2, ngram_chain_len=4, grafting=Grafting.OVERWRITE
    )
    # step 2 (mid) re-expands the root: non-destructive adds 10 and 11 next to 7, overwrite replaces 7
    assert sorted(keep.children[0]) == [7, 10, 11] and keep.n_alive == 1 + 3 + 2
    assert sorted(over.children[0]) == [10, 11] and over.n_alive == 1 + 2 and len(over) == 6


def test_sequential_cascade_grows_one_chain():
    committed = [5, 6, 7, 5, 6, 7, 5, 6]
    tree, records, _ = build("10101", committed, sequential=True)
    assert all(len(tree.children[v]) <= 1 for v in tree.live_nodes())
    assert all(r.frontier_size == 1 for r in records)
