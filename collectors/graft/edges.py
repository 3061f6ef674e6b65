"""TDES training data: greedy DDTree rounds of a block drafter, every candidate edge labelled.

Contract: :func:`collect_prompt` decodes one prompt greedily with ``generate(..., "ddtree")`` (the
lossless path every other policy uses) behind a proposer that records each round's marginals and
committed length. Greedy decoding is token-identical to the target, so the output is the target's
greedy continuation, and one teacher-forced target forward over prompt + output gives the target's
logits at every position of it. From those, each round is rebuilt exactly (build_ddtree on the
recorded marginals, same budget) and its accepted path is the tree's longest path along the
continuation; a rebuilt round whose accepted length differs from what decoding committed is an
error, never a silent row. A round is recorded only when the continuation covers all K positions
after its root (the last rounds of a prompt may not), so every label is known.

Rows (features/edge_schemas.py): one ``edge_rounds`` row per recorded round, one ``edges`` row per
(tree node above depth K, candidate at the next depth). Columns are filled as lists here and turned
into Arrow tables with the declared schema once per stage.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from decoder.core.config import BlockConfig, DecodeConfig
from decoder.core.tree import DraftTree
from decoder.generate import generate
from decoder.graft.block import BlockProposer, Marginals
from decoder.graft.ddtree import build_ddtree
from decoder.models.pair import ModelPair
from features.edge_schemas import EDGE_ROUNDS, EDGES
from features.tables import SchemaError, TableSpec


class RecordingProposer:
    """A BlockProposer that passes calls through and keeps (committed length, marginals) per call."""

    def __init__(self, inner: BlockProposer) -> None:
        self.inner = inner
        self.k = inner.k
        self.target_layers = inner.target_layers
        self.calls: list[tuple[int, Marginals]] = []

    def propose(self, features: torch.Tensor | None, committed: list[int], topk: int) -> Marginals:
        got = self.inner.propose(features, committed, topk)
        self.calls.append((len(committed), got))
        return got


@dataclass
class Columns:
    """Rows of one table as column lists, appended to by prompt and turned into Arrow once."""

    spec: TableSpec
    data: dict[str, list] = field(default_factory=lambda: defaultdict(list))

    def add(self, **values: object) -> None:
        for name, value in values.items():
            self.data[name].append(value)

    def extend(self, n: int, **values: object) -> None:
        """Append n rows: list values are per row, scalars are repeated."""
        for name, value in values.items():
            self.data[name].extend(value if isinstance(value, list) else [value] * n)

    def table(self) -> pa.Table:
        if set(self.data) - set(self.spec.names) or (self.data and set(self.spec.names) - set(self.data)):
            raise SchemaError(f"{self.spec.tag}: columns {sorted(self.data)} differ from {self.spec.names}")
        return pa.table({n: self.data.get(n, []) for n in self.spec.names}, schema=self.spec.schema)


@dataclass(frozen=True)
class PromptKey:
    pair_id: str
    drafter_id: str
    dataset_id: str
    prompt_id: int

    def values(self) -> dict[str, object]:
        return {"pair_id": self.pair_id, "drafter_id": self.drafter_id, "dataset_id": self.dataset_id,
                "prompt_id": self.prompt_id}  # fmt: skip


@dataclass(frozen=True)
class PromptStats:
    rounds: int  # rounds recorded
    skipped: int  # tail rounds the continuation does not cover
    new_tokens: int
    argmax_disagreements: int  # accepted parents whose teacher-forced argmax is not the output token


def accepted_path(tree: DraftTree, greedy: list[int]) -> list[int]:
    """Nodes of the tree along the greedy continuation, root first."""
    path = [0]
    for token in greedy:
        child = tree.children[path[-1]].get(token)
        if child is None:
            break
        path.append(child)
    return path


@dataclass(frozen=True)
class TreeMatch:
    """One tree against the target's greedy continuation after its root."""

    accepted: int  # A: tree nodes along the continuation
    target_nodes: int  # nodes at depth >= 2 carrying the continuation's token for their depth
    mismatched: int  # of those, under a parent off the continuation's path


def tree_match(tree: DraftTree, greedy: list[int]) -> TreeMatch:
    """A and the parent-child mismatch counts of a tree (depth 1 is never mismatched: the root is
    every depth-1 node's parent). ``greedy`` may be shorter than the tree is deep (the end of a
    continuation): deeper nodes then carry no known target token and are not counted."""
    path = accepted_path(tree, greedy)
    on_path = set(path)
    carrying = [
        v
        for v in range(1, len(tree))
        if 2 <= tree.depths[v] <= len(greedy) and tree.tokens[v] == greedy[tree.depths[v] - 1]
    ]
    wrong = sum(tree.parents[v] not in on_path for v in carrying)
    return TreeMatch(len(path) - 1, len(carrying), wrong)


@torch.no_grad()
def teacher_logits(pair: ModelPair, sequence: list[int]) -> np.ndarray:
    """The target's logits after every prefix of ``sequence`` but the full one: (len - 1, V)."""
    ids = torch.tensor([sequence[:-1]], device=pair.target.device)
    return pair.target(input_ids=ids).logits[0, :, : pair.vocab_size].float().cpu().numpy()


def collect_prompt(
    pair: ModelPair,
    proposer: BlockProposer,
    prompt: list[int],
    key: PromptKey,
    block: BlockConfig,
    max_new_tokens: int,
    rounds: Columns,
    edges: Columns,
) -> PromptStats:
    """Decode one prompt with DDTree, then append its recorded rounds and edges to the columns."""
    recorder = RecordingProposer(proposer)
    config = DecodeConfig(max_new_tokens=max_new_tokens, block=block)
    result = generate(pair, prompt, "ddtree", config, timing=False, proposer=recorder)
    sequence = list(prompt) + list(result.new_tokens)
    logits = teacher_logits(pair, sequence)
    recorded = skipped = disagree = 0
    for i, (n, marg) in enumerate(recorder.calls):
        k, m = marg.ids.shape
        greedy = sequence[n : n + k]
        if len(greedy) < k:
            skipped += 1
            continue
        tree = build_ddtree(sequence[n - 1], marg.ids, marg.logps, block.budget, pair.vocab_size)
        path = accepted_path(tree, greedy)
        if i + 1 < len(recorder.calls) and recorder.calls[i + 1][0] - n != len(path):
            raise RuntimeError(
                f"{key}: round {i} rebuilt with {len(path) - 1} accepted tokens, decoding committed "
                f"{recorder.calls[i + 1][0] - n - 1}: the rebuilt tree is not the decoded one"
            )
        rounds.add(**key.values(), round_id=i, root_token=sequence[n - 1], start_position=n, k=k, m=m,
                   accepted=len(path) - 1, cand_ids=marg.ids.reshape(-1).tolist(),
                   cand_logps=marg.logps.reshape(-1).tolist(), greedy_ids=greedy)  # fmt: skip
        on_path = {v: j for j, v in enumerate(path)}
        for p in range(len(tree)):
            depth = tree.depths[p]
            if depth >= k or not tree.alive[p]:
                continue
            cands = marg.ids[depth]
            j = on_path.get(p)
            if j is not None:
                row = logits[n - 1 + j]
                disagree += int(int(row.argmax()) != greedy[j])
            edges.extend(
                m,
                **key.values(),
                round_id=i,
                depth=depth + 1,
                parent_node=p,
                parent_token=tree.tokens[p],
                child_token=cands.tolist(),
                child_rank=list(range(m)),
                logq=marg.logps[depth].tolist(),
                is_in_tree=[int(c) in tree.children[p] for c in cands],
                is_accepted_parent=j is not None,
                is_target=[j is not None and int(c) == greedy[j] for c in cands],
                target_logit=row[cands].astype(np.float64).tolist() if j is not None else [None] * m,
            )
        recorded += 1
    return PromptStats(recorded, skipped, len(result.new_tokens), disagree)


def new_columns() -> tuple[Columns, Columns]:
    """Empty (edge_rounds, edges) columns."""
    return Columns(EDGE_ROUNDS), Columns(EDGES)
