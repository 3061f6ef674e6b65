"""GRAFT's evaluation rows on one prompt: DDTree decoded for real, and the budget grid by exact walk.

Contract (temperature 0):
- :func:`decode_arm` decodes the prompt with ``generate(..., "ddtree")`` at one budget, with or
  without the TDES scorer, behind collectors/edges.py's RecordingProposer. Each round's tree is
  rebuilt from the recorded marginals (decoding is deterministic, so it is the decoded tree; a
  rebuilt round whose verified size or accepted length differs from the decoded one is an error)
  and matched against the output after its root: A, tree size and the parent-child mismatch
  counts (collectors/edges.py, tree_match).
- :func:`lossless_gate`: one teacher-forced target forward over prompt + output; every output token
  must be the target's argmax after its prefix (the output is the target's own greedy
  continuation), and the forward's hidden states are the drafter's features for the walk.
- :func:`walk_budgets` is the replay trick made exact for every budget at once: at every start
  position L of the continuation the drafter proposes from the target's features of the first
  L - 1 positions, DDTree is built once at b_max, and the one greedy check of that largest tree
  gives the accepted length under every B <= b_max (decoder.budget.budget_sweep: DDTree's pops at
  B are the first B pops at b_max). Walking L -> L + A_B + 1 from the prompt's end is then the
  round sequence of decoding at B, which :func:`decode_arm` at the same B must reproduce
  (the stage records the agreement; tests/test_graft_eval.py checks it). With a TDES scorer the
  same holds: the edge-scored heap also pops in node order and prune(B) keeps its first B pops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from collectors.edges import RecordingProposer, accepted_path, tree_match
from decoder.block import BlockProposer, Marginals
from decoder.budget import budget_sweep
from decoder.config import BlockConfig, DecodeConfig
from decoder.ddtree import build_ddtree
from decoder.edge_scorer import EdgeScorer
from decoder.generate import generate
from decoder.models import ModelPair
from decoder.tensors import layer_features
from decoder.tree import DraftTree


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


def decode_arm(
    pair: ModelPair,
    proposer: BlockProposer,
    scorer: EdgeScorer | None,
    prompt: list[int],
    budget: int,
    topk: int,
    max_new_tokens: int,
) -> ArmRun:
    """Greedy DDTree decoding at ``budget`` (TDES-ranked with ``scorer``), every round matched."""
    recorder = RecordingProposer(proposer)
    config = DecodeConfig(
        max_new_tokens=max_new_tokens, block=BlockConfig(budget=budget, topk=topk, k=proposer.k)
    )
    result = generate(pair, prompt, "ddtree", config, timing=False, proposer=recorder, edge_scorer=scorer)
    sequence = list(prompt) + list(result.new_tokens)
    rounds = []
    for i, ((n, marg), stats) in enumerate(zip(recorder.calls, result.rounds, strict=True)):
        root = sequence[n - 1]
        edges = None if scorer is None else scorer.for_round(root, marg.ids, marg.logps)
        tree = build_ddtree(root, marg.ids, marg.logps, budget, pair.vocab_size, edges)
        match = tree_match(tree, sequence[n : n + marg.k])
        if len(tree) - 1 != stats.verified_size or min(match.accepted, stats.emitted) != stats.accepted:
            raise RuntimeError(
                f"round {i} at B={budget}: rebuilt tree of {len(tree) - 1} nodes accepting "
                f"{match.accepted}, decoding verified {stats.verified_size} and accepted {stats.accepted}"
            )
        rounds.append(
            Round(stats.accepted, stats.emitted, stats.verified_size, match.target_nodes, match.mismatched)
        )
    return ArmRun(list(result.new_tokens), rounds)


@torch.inference_mode()
def lossless_gate(
    pair: ModelPair, prompt: list[int], tokens: list[int], layers: tuple[int, ...]
) -> torch.Tensor:
    """Check ``tokens`` is the target's greedy continuation of ``prompt``; return the target's
    features ([len(prompt) + len(tokens) - 1, len(layers) * H]) of that forward."""
    sequence = list(prompt) + list(tokens)
    ids = torch.tensor([sequence[:-1]], device=pair.target.device)
    out = pair.target(input_ids=ids, output_hidden_states=bool(layers))
    argmax = out.logits[0, len(prompt) - 1 :, : pair.vocab_size].argmax(-1).tolist()
    wrong = [i for i, (a, t) in enumerate(zip(argmax, tokens, strict=True)) if a != t]
    if wrong:
        raise RuntimeError(
            f"lossless gate: output token {wrong[0]} is {tokens[wrong[0]]}, the target's greedy token "
            f"there is {argmax[wrong[0]]} ({len(wrong)} of {len(tokens)} differ)"
        )
    return layer_features(out.hidden_states, layers) if layers else torch.zeros(len(sequence) - 1, 0)


@dataclass(frozen=True)
class Walk:
    """Per budget B (index 0..b_max): the rounds of decoding at B, as counts."""

    rounds: list[list[Round]]

    def at(self, budget: int) -> list[Round]:
        return self.rounds[budget]


@torch.inference_mode()
def walk_budgets(
    proposer: BlockProposer,
    prompt: list[int],
    tokens: list[int],
    features: torch.Tensor,
    b_max: int,
    topk: int,
    vocab_size: int,
    scorer: EdgeScorer | None = None,
    proposals: dict[int, Marginals] | None = None,
) -> Walk:
    """The round sequences of greedy DDTree decoding at every B in 1..b_max (module docstring), the
    trees ranked by TDES with ``scorer``. ``proposals`` (start position -> the drafter's marginals
    there) is read and filled, so a second walk of the same output need not run the drafter again."""
    sequence = list(prompt) + list(tokens)
    end = len(sequence)
    sweeps: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
    proposals = {} if proposals is None else proposals

    def at_start(n: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        if n not in sweeps:
            committed = sequence[:n]
            if n not in proposals:
                feats = features[: n - 1] if proposer.target_layers else None
                proposals[n] = proposer.propose(feats, committed, topk)
            marg = proposals[n]
            edges = None if scorer is None else scorer.for_round(committed[-1], marg.ids, marg.logps)
            tree = build_ddtree(committed[-1], marg.ids, marg.logps, b_max, vocab_size, edges)
            greedy = sequence[n : n + marg.k]
            path = accepted_path(tree, greedy)[1:]
            sweep = budget_sweep(tree, path, b_max)
            sweeps[n] = (sweep.accepted, sweep.kept, target_counts(tree, greedy, path, b_max))
        return sweeps[n]

    out: list[list[Round]] = [[]]
    for b in range(1, b_max + 1):
        rounds, n = [], len(prompt)
        while n < end:
            acc, kept, carry = at_start(n)
            emitted = min(int(acc[b]) + 1, end - n)
            target_nodes, mismatched = carry[b]
            rounds.append(Round(min(int(acc[b]), emitted), emitted, int(kept[b]), target_nodes, mismatched))
            n += emitted
        out.append(rounds)
    return Walk(out)


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
