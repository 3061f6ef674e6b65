"""GRAFT's evaluation rows on one prompt: DDTree decoded for real, and the budget grid by exact walk.

Contract (temperature 0):
- :func:`decode_arm` decodes the prompt with ``generate(..., "ddtree")`` at one budget, with or
  without the TDES scorer, behind collectors/graft/edges.py's RecordingProposer. Each round's tree is
  rebuilt from the recorded marginals (decoding is deterministic, so it is the decoded tree; a
  rebuilt round whose verified size or accepted length differs from the decoded one is an error)
  and matched against the output after its root: A, tree size and the parent-child mismatch
  counts (collectors/graft/edges.py, tree_match).
- :func:`lossless_gate`: one teacher-forced target forward over prompt + output; every output token
  must be the target's argmax after its prefix (the output is the target's own greedy
  continuation), and the forward's hidden states are the drafter's features for the walk
  (:func:`gate_check`: the same forward, the first wrong token named instead of raised).
- :class:`BudgetWalker` is the replay trick made exact for every budget at once: at every start
  position L of the continuation the drafter proposes from the target's features of the first
  L - 1 positions, DDTree is built once at b_max, and the one greedy check of that largest tree
  gives the accepted length under every B <= b_max (decoder.core.budget.budget_sweep: DDTree's pops at
  B are the first B pops at b_max). Walking L -> L + A_B + 1 from the first round start (after the
  prefill's token) is then the
  round sequence of decoding at B, which :func:`decode_arm` at the same B must reproduce
  (the stage records the agreement; tests/test_graft_eval.py checks it). With a TDES scorer the
  same holds: the edge-scored heap also pops in node order and prune(B) keeps its first B pops.
  The walker holds those per-start sweeps; besides every fixed B it walks a per-round
  budget rule (decoder/graft/budget.py: each visited start decides B_t from its own tree, as
  decoding with ``BlockConfig(rule=...)`` does, which :func:`decode_arm` must reproduce) and gives
  the fitting rows of that rule: every node among the first b_max of each start a walk visits, its
  features and whether it is on the target's path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from collectors.collect.batch_greedy import GreedyCheck, check_greedy
from collectors.graft.edges import RecordingProposer, accepted_path, tree_match
from decoder.core.budget import budget_sweep
from decoder.core.config import BlockBudgetRule, BlockConfig, DecodeConfig
from decoder.core.outcome import first_round_start
from decoder.core.tensors import layer_features
from decoder.core.tree import DraftTree
from decoder.generate import generate
from decoder.graft.block import BlockProposer, Marginals
from decoder.graft.budget import node_features, rule_budget
from decoder.graft.ddtree import build_ddtree
from decoder.graft.decode import round_tree
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair


@dataclass(frozen=True)
class Round:
    """One round's counts: what pricing and the table need."""

    accepted: int  # drafted tokens accepted and emitted
    emitted: int
    nodes: int  # drafted nodes verified
    target_nodes: int  # depth >= 2 nodes carrying the target's token
    mismatched: int  # of those, under a parent off the target's path


@dataclass(frozen=True)
class ArmRun:
    tokens: list[int]
    rounds: list[Round]
    decode_s: float  # wall seconds of decoding after prefill


def decode_ar(pair: ModelPair, prompt: list[int], max_new_tokens: int) -> ArmRun:
    """Plain greedy target decoding, timed like decode_arm (the wall-clock baseline)."""
    result = generate(pair, prompt, "ar", DecodeConfig(max_new_tokens=max_new_tokens), timing=False)
    return ArmRun(list(result.new_tokens), [], result.wall_s - result.prefill_s)


def decode_arm(
    pair: ModelPair,
    proposer: BlockProposer,
    scorer: EdgeScorer | None,
    prompt: list[int],
    budget: int,
    topk: int,
    max_new_tokens: int,
    rule: BlockBudgetRule | None = None,
) -> ArmRun:
    """Greedy DDTree decoding at ``budget`` (TDES-ranked with ``scorer``; with ``rule``, each
    round's budget by the rule instead), every round matched."""
    recorder = RecordingProposer(proposer)
    block = BlockConfig(budget=budget, topk=topk, k=proposer.k, rule=rule)
    config = DecodeConfig(max_new_tokens=max_new_tokens, block=block)
    result = generate(pair, prompt, "ddtree", config, timing=False, proposer=recorder, edge_scorer=scorer)
    sequence = list(prompt) + list(result.new_tokens)
    rounds, prev = [], 0
    for i, ((n, marg), stats) in enumerate(zip(recorder.calls, result.rounds, strict=True)):
        root = sequence[n - 1]
        edges = None if scorer is None else scorer.for_round(root, marg.ids, marg.logps)
        tree = round_tree(root, marg, block, pair.vocab_size, edges, prev)
        match = tree_match(tree, sequence[n : n + marg.k])
        prev = match.accepted
        if len(tree) - 1 != stats.verified_size or min(match.accepted, stats.emitted) != stats.accepted:
            raise RuntimeError(
                f"round {i} at B={budget}: rebuilt tree of {len(tree) - 1} nodes accepting "
                f"{match.accepted}, decoding verified {stats.verified_size} and accepted {stats.accepted}"
            )
        rounds.append(
            Round(stats.accepted, stats.emitted, stats.verified_size, match.target_nodes, match.mismatched)
        )
    return ArmRun(list(result.new_tokens), rounds, result.wall_s - result.prefill_s)


def gate_check(
    pair: ModelPair, prompt: list[int], tokens: list[int], layers: tuple[int, ...]
) -> tuple[GreedyCheck, torch.Tensor]:
    """One teacher-forced target forward over prompt + ``tokens``: ``tokens`` against the target's
    greedy token after each prefix (collectors.collect.batch_greedy.check_greedy); the target's features of
    that forward, [len(prompt) + len(tokens) - 1, len(layers) * H]."""
    check = check_greedy(pair.target, prompt, tokens, pair.vocab_size, hidden_states=bool(layers))
    if check.hidden is None:
        return check, torch.zeros(len(prompt) + len(tokens) - 1, 0)
    return check, layer_features(check.hidden, layers)


def lossless_gate(
    pair: ModelPair, prompt: list[int], tokens: list[int], layers: tuple[int, ...]
) -> torch.Tensor:
    """Check ``tokens`` is the target's greedy continuation of ``prompt`` (:func:`gate_check`); return
    the target's features of that forward."""
    check, features = gate_check(pair, prompt, tokens, layers)
    wrong = check.wrong
    if wrong is not None:
        raise RuntimeError(
            f"lossless gate: output token {wrong} ({tokens[wrong]}) of {len(tokens)} is not the target's "
            f"greedy token after its prefix ({check.greedy[wrong]}); {check.n_wrong} of the {len(tokens)} "
            "are not the greedy token after their prefix"
        )
    return features


@dataclass(frozen=True)
class Walk:
    """Per budget B (index 0..b_max): the rounds of decoding at B, as counts."""

    rounds: list[list[Round]]

    def at(self, budget: int) -> list[Round]:
        return self.rounds[budget]


@dataclass(frozen=True)
class StartSweep:
    """One start position's largest tree, checked once: what every budget and rule needs."""

    tree: DraftTree  # DDTree at b_max
    first_logp: float  # the drafter's best log-marginal at position 1
    k: int  # positions the drafter proposed
    accepted: np.ndarray  # accepted drafted tokens under B = 0..b_max
    kept: np.ndarray  # verified drafted nodes under B = 0..b_max
    counts: list[tuple[int, int]]  # (target-carrying, mismatched) nodes under B = 0..b_max
    on_path: np.ndarray  # (min(b_max, nodes),) bool: node i (pop order) on the target's path


class BudgetWalker:
    """Exact walks of one greedy output under every budget and under budget rules (module docstring).

    ``proposals`` (start position -> the drafter's marginals there) is read and filled, so a second
    walker over the same output (e.g. TDES-ranked) need not run the drafter again."""

    def __init__(
        self,
        proposer: BlockProposer,
        prompt: list[int],
        tokens: list[int],
        features: torch.Tensor,
        b_max: int,
        topk: int,
        vocab_size: int,
        scorer: EdgeScorer | None = None,
        proposals: dict[int, Marginals] | None = None,
    ) -> None:
        self.proposer, self.features, self.b_max, self.topk = proposer, features, b_max, topk
        self.vocab_size, self.scorer = vocab_size, scorer
        self.first_start = first_round_start(prompt)
        self.prompt_len = len(prompt)
        self.sequence = list(prompt) + list(tokens)
        self.proposals = {} if proposals is None else proposals
        self._sweeps: dict[int, StartSweep] = {}
        self._fixed: dict[int, list[Round]] = {}  # budget -> its walk, taken once for every caller

    @property
    def tokens(self) -> list[int]:
        """The output walked: the target's greedy continuation of the prompt."""
        return self.sequence[self.prompt_len :]

    @torch.inference_mode()
    def start(self, n: int) -> StartSweep:
        if n not in self._sweeps:
            committed = self.sequence[:n]
            if n not in self.proposals:
                feats = self.features[: n - 1] if self.proposer.target_layers else None
                self.proposals[n] = self.proposer.propose(feats, committed, self.topk)
            marg = self.proposals[n]
            s = self.scorer
            edges = None if s is None else s.for_round(committed[-1], marg.ids, marg.logps)
            tree = build_ddtree(committed[-1], marg.ids, marg.logps, self.b_max, self.vocab_size, edges)
            greedy = self.sequence[n : n + marg.k]
            path = accepted_path(tree, greedy)[1:]
            sweep = budget_sweep(tree, path, self.b_max)
            on_path = np.zeros(min(self.b_max, len(tree) - 1), dtype=bool)
            on_path[[v - 1 for v in path if v <= len(on_path)]] = True
            self._sweeps[n] = StartSweep(tree, marg.first_logp, marg.k, sweep.accepted, sweep.kept,
                                         target_counts(tree, greedy, path, self.b_max), on_path)  # fmt: skip
        return self._sweeps[n]

    def walk(self, choose) -> list[Round]:
        """Rounds from the prompt's end when each start's budget is choose(sweep, prev_accepted)."""
        rounds, n, prev, end = [], self.first_start, 0, len(self.sequence)
        while n < end:
            sw = self.start(n)
            b = choose(sw, prev)
            emitted = min(int(sw.accepted[b]) + 1, end - n)
            target_nodes, mismatched = sw.counts[b]
            rounds.append(Round(min(int(sw.accepted[b]), emitted), emitted, int(sw.kept[b]), target_nodes,
                                mismatched))  # fmt: skip
            prev = int(sw.accepted[b])
            n += emitted
        return rounds

    def fixed(self, budget: int) -> list[Round]:
        """The rounds of greedy DDTree decoding at ``budget`` (walked once; callers share the list)."""
        if budget not in self._fixed:
            self._fixed[budget] = self.walk(lambda sw, prev: budget)
        return self._fixed[budget]

    def every_budget(self) -> Walk:
        """The round sequences of greedy DDTree decoding at every B in 1..b_max."""
        return Walk([[]] + [self.fixed(b) for b in range(1, self.b_max + 1)])

    def ruled(self, rule: BlockBudgetRule) -> list[Round]:
        if rule.cap > self.b_max:
            raise ValueError(f"rule cap {rule.cap} exceeds the walked b_max {self.b_max}")
        return self.walk(lambda sw, prev: rule_budget(sw.tree, sw.first_logp, prev, sw.k, rule))

    def node_rows(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """(features, on-path labels) of the first b_max nodes of every start the walk at ``budget``
        visits, each start's acceptance history that walk's."""
        xs, ys = [], []

        def record(sw: StartSweep, prev: int) -> int:
            xs.append(node_features(sw.tree, self.b_max, sw.first_logp, prev, sw.k))
            ys.append(sw.on_path)
            return budget

        self.walk(record)
        return np.concatenate(xs), np.concatenate(ys)


def target_counts(tree: DraftTree, greedy: list[int], path: list[int], b_max: int) -> list[tuple[int, int]]:
    """Per B in 0..b_max: (target-carrying nodes at depth >= 2, mismatched ones) among the first B
    nodes of a DDTree (its pops are in node order, so prune(B) keeps nodes 1..B)."""
    on_path = {0, *path}
    counts, carrying, wrong = [(0, 0)], 0, 0
    for v in range(1, b_max + 1):
        if v < len(tree):
            d = tree.depths[v]
            if 2 <= d <= len(greedy) and tree.tokens[v] == greedy[d - 1]:
                carrying += 1
                wrong += tree.parents[v] not in on_path
        counts.append((carrying, wrong))
    return counts
