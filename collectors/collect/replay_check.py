"""Does the batched replay give the per-start replay's rows? Equal counts, or a classified near-tie.

The batched replay (collectors/collect/grow.py) serves the mid calls of every round start of a
prompt in shared forwards; the per-start replay (``Replayer.grow_one_start``) runs one forward per
start and step. The two sum attention and matmuls in another order, so a mid row differs in its last
bits, and a decision between two near-tied scores may go the other way. A row is one (round start,
schedule) outcome: accepted length, verified nodes, mid call sizes, fed nodes, tree nodes, small
frontier and prompt blocks must be equal, the recorded signals equal to float rounding
(``SIGNAL_RTOL``). A row that differs is explained at the first decision where the two branches'
trees part (:func:`classify`):

- ``children``: the same node grew different children: a mid top-m pick; the gap is between the two
  tokens' logits in the mid drafter's row, recomputed in fp32 (``Fp32Judge``: one plain causal
  forward of an fp32 copy of the mid over the node's context), as decoder.check_lossless judges the
  target;
- ``frontier``: different nodes were expanded: a top-W pick by path score; the gap is between the
  two nodes' path scores;
- ``prune``: the same tree verified different nodes: the gap is between the first two nodes the
  two prunes order differently;
- ``scores``: the same tree and prune order, yet other counts (a per-round budget rule reading the
  scores): the largest path-score difference between the two trees;
- ``signals``: equal counts, but recorded signals (means of mid scores) differ by more than float
  rounding (``SIGNAL_RTOL``): the largest difference between two of them.

A difference is a **near-tie** when its gap is within ``tolerance_for(dtype, scale)``: for bf16 and
fp16 the tolerance of decoder.check_lossless (four bf16 ulps, relative to the larger of 1 and the
logit or score), for fp32 2^-14 relative: two fp32 computations that differ only in the order of
their sums (measured: below 1e-6 on the test models). Otherwise it is a **real mismatch**.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from collectors.collect.branch import Branch
from collectors.collect.branch_mid import committed_kv
from collectors.collect.replay import Replayer, ReplayInputs
from collectors.collect.trajectory import BranchOutcome
from decoder.core.budget import prune_order, verify_budget
from decoder.core.config import TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.outcome import first_round_start
from decoder.core.tensors import causal_block, forward_block
from decoder.core.tree import DraftTree

RELATIVE_TOLERANCE = {torch.float32: 2.0**-14, torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8}
SIGNAL_RTOL, SIGNAL_ATOL = 1e-4, 1e-5  # recorded signals: means and shares of mid scores


def tolerance_for(dtype: torch.dtype, scale: float) -> float:
    """Absolute near-tie tolerance for a gap between values of magnitude about ``scale``."""
    if dtype not in RELATIVE_TOLERANCE:
        raise ValueError(f"no near-tie tolerance for {dtype}; known: {sorted(map(str, RELATIVE_TOLERANCE))}")
    return RELATIVE_TOLERANCE[dtype] * max(1.0, abs(scale))


def counts(o: BranchOutcome) -> tuple:
    """The exact part of a row."""
    return (o.accepted, o.verified_nodes, o.mid_tree_tokens, o.fed_accepted, o.tree_nodes,
            o.small_frontier, o.prompt_blocks)  # fmt: skip


def signal_gap(a: BranchOutcome, b: BranchOutcome) -> tuple[float, float]:
    """(largest difference between the two rows' recorded signals, the magnitude it is relative to)."""
    pairs = [(x, y) for sa, sb in zip(a.signals, b.signals, strict=True) for x, y in zip(sa, sb, strict=True)]
    if not pairs:
        return 0.0, 1.0
    x, y = max(pairs, key=lambda p: abs(p[0] - p[1]))
    return abs(x - y), max(abs(x), abs(y))


@dataclass(frozen=True)
class RowDifference:
    start: int
    bits: tuple[bool, ...]
    kind: str  # children | frontier | prune | scores
    gap: float
    tolerance: float

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.tolerance


@dataclass
class ReplayCheck:
    """Rows compared over a set of prompts, and every difference classified."""

    rows: int = 0
    differences: list[RowDifference] = field(default_factory=list)
    trajectories: int = 0
    equal_trajectories: int = 0

    @property
    def share_differing(self) -> float:
        return len(self.differences) / self.rows if self.rows else 0.0

    @property
    def real_mismatches(self) -> list[RowDifference]:
        return [d for d in self.differences if not d.near_tie]


class Fp32Judge:
    """The mid drafter in fp32 on the host: its logits after a context, one plain causal forward."""

    def __init__(self, mid: torch.nn.Module, vocab_size: int) -> None:
        self.model = copy.deepcopy(mid).to(device="cpu", dtype=torch.float32)
        self.vocab_size = vocab_size
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(self, context: Sequence[int]) -> torch.Tensor:
        key = tuple(int(t) for t in context)
        if key not in self._memo:
            block = causal_block(list(key), 0, 0)
            self._memo[key] = forward_block(self.model, DynamicCache(), block, logits_to_keep=1)[
                -1, : self.vocab_size
            ]
        return self._memo[key]


def classify(
    a: DraftTree,
    b: DraftTree,
    bits: tuple[bool, ...],
    config: TreeConfig,
    committed: Sequence[int],
    judge: Fp32Judge | None,
    dtype: torch.dtype,
) -> tuple[str, float, float]:
    """(kind, gap, tolerance) of the first decision where the branch trees ``a`` (the per-start
    replay's) and ``b`` (the batched one's) of schedule ``bits`` part (module docstring)."""
    n = min(len(a), len(b))
    first = next((i for i in range(1, n) if (a.parents[i], a.tokens[i]) != (b.parents[i], b.tokens[i])), None)
    if first is None and len(a) != len(b):
        first = n  # the longer tree grew a node the shorter one did not
    if first is None:
        return _same_structure(a, b, config, dtype)
    if first < n and a.parents[first] != b.parents[first]:  # another node was expanded first
        sa, sb = a.scores[a.parents[first]], a.scores[b.parents[first]]
        return "frontier", abs(sa - sb), tolerance_for(dtype, max(abs(sa), abs(sb)))
    grown = a if first < len(a) else b
    u, step = grown.parents[first], grown.created_step[first]
    if not bits[step - 1]:  # a small step expanded a node the other branch did not
        others = [grown.scores[w] for w in range(first) if w != u and grown.alive[w]]
        gap = min((abs(grown.scores[u] - s) for s in others), default=math.inf)
        return "frontier", gap, tolerance_for(dtype, grown.scores[u])
    row = _row(grown, u, committed, judge)
    top = float(row.max())
    if first < n:  # the same node grew another child first: two of its top-m picks
        x, y = a.tokens[first], b.tokens[first]
        return "children", abs(float(row[x]) - float(row[y])), tolerance_for(dtype, top)
    # one branch grew a child the other did not: it sat at the top-m boundary of the node's row
    m = 1 if config.sequential else config.topk
    ranked = torch.topk(row, k=min(m + 1, row.shape[0])).values.tolist()
    y = float(row[grown.tokens[first]])
    return "children", min(abs(y - v) for v in ranked[m - 1 : m + 1]), tolerance_for(dtype, top)


def _row(tree: DraftTree, u: int, committed: Sequence[int], judge: Fp32Judge | None) -> torch.Tensor:
    """The mid's logits after node ``u``: recomputed in fp32 by the judge, else (no judge) the
    tree's own edge log-probs of u's children (all that is known of its row)."""
    if judge is not None:
        return judge.logits([*committed, *tree.path_tokens(u)])
    row = torch.full((max(tree.tokens) + 1,), -math.inf)
    for token, v in tree.children[u].items():
        row[token] = tree.edge_logp[v]
    return row


def _same_structure(
    a: DraftTree, b: DraftTree, config: TreeConfig, dtype: torch.dtype
) -> tuple[str, float, float]:
    """Equal trees that verified differently: the prune's first disagreement, else the scores."""
    oa, ob = prune_order(a), prune_order(b)
    j = next((i for i, (x, y) in enumerate(zip(oa, ob, strict=True)) if x != y), None)
    if j is not None:
        sa, sb = a.scores[oa[j]], a.scores[ob[j]]
        return "prune", abs(sa - sb), tolerance_for(dtype, max(abs(sa), abs(sb)))
    gap = max((abs(x - y) for x, y in zip(a.scores, b.scores, strict=True)), default=0.0)
    if verify_budget(a, config) == verify_budget(b, config):
        gap = math.inf  # nothing a near-tie explains: equal trees, prunes and budgets
    return "scores", gap, tolerance_for(dtype, max((abs(s) for s in a.scores), default=1.0))


def per_start_branches(rep: Replayer, inputs: ReplayInputs) -> dict[int, list[Branch]]:
    """Every schedule's branches after the last step at every start, grown one start at a time."""
    prompt, text = inputs.prompt, inputs.text
    ngram = rep.ngram_with_rows(prompt, text)
    builder = RoundBuilder(rep.config.tree, ngram, None, lambda: 0.0)
    ngram.commit(prompt)
    p0 = first_round_start(prompt)
    out = {}
    for start in range(p0, p0 + inputs.round_tokens):
        ngram.commit(text[len(ngram.index.tokens) : start])
        context = committed_kv(inputs.mid_kv, start - 1) if inputs.mid_kv is not None else None
        out[start] = rep.grow_one_start(builder, context, text, start, rep.prefixes())
    return out


def check_prompt(
    one: Replayer, batched: Replayer, prompt: list[int], judge: Fp32Judge | None, into: ReplayCheck
) -> None:
    """Replay ``prompt`` both ways (``one``: one start at a time, ``batched``: with batch_rows) and
    add every (start, schedule) row and trajectory to ``into``."""
    if one.batch_rows or not batched.batch_rows:
        raise ValueError("check_prompt compares a one-start-at-a-time replayer with a batched one")
    inputs = batched.inputs(prompt)
    text = inputs.text
    mid_kv = one.mid_kv_of(text) if one.pair.mid is not None else None
    one_inputs = ReplayInputs(inputs.prompt, text, inputs.limit, mid_kv)
    seq = per_start_branches(one, one_inputs)
    bat = batched.grow_all(inputs, batched.prefixes())
    dtype = one.pair.mid.dtype if one.pair.mid is not None else torch.float32
    for start, level in seq.items():
        mine = {b.bits: b for b in bat[start]}
        for b in level:
            other = mine[b.bits]
            into.rows += 1
            oa, ob = one.finish(b, text, start), batched.finish(other, text, start)
            if counts(oa) == counts(ob):
                gap, scale = signal_gap(oa, ob)
                if gap > SIGNAL_ATOL + SIGNAL_RTOL * scale:
                    into.differences.append(
                        RowDifference(start, b.bits, "signals", gap, tolerance_for(dtype, scale))
                    )
                continue
            kind, gap, tol = classify(
                b.state.tree, other.state.tree, b.bits, one.config.tree, text[:start], judge, dtype
            )
            into.differences.append(RowDifference(start, b.bits, kind, gap, tol))
    a, c = one.replay_prompt(prompt, one_inputs), batched.replay_prompt(prompt, inputs, bat)
    for s in range(len(one.schedules)):
        into.trajectories += 1
        into.equal_trajectories += [counts_of(r) for r in a.rounds[s]] == [counts_of(r) for r in c.rounds[s]]


def counts_of(r) -> tuple:
    """A trajectory round's exact part (RoundRecord)."""
    return (r.accepted, r.emitted, r.verified_nodes, r.mid_tree_tokens, r.mid_catch_up, r.small_steps,
            r.tree_nodes, r.small_frontier, r.mid_lag, r.prompt_blocks)  # fmt: skip
