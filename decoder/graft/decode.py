"""The `ddtree` decoding path (GRAFT, design/GRAFT.md): block proposer -> DDTree -> verify.

Each round the proposer gives per-position marginals for the K positions after the root (reading
the target features the verifier keeps, when its target_layers ask for any), decoder/graft/ddtree.py
builds the best tree of config.block.budget nodes from them, and the same TargetVerifier as every
other policy verifies it, greedy or by lossless rejection sampling, and commits. Rounds are
recorded as RoundStats with no steps; the proposer's time is its "mid" component. With an
EdgeScorer (GRAFT's TDES, decoder/graft/edge_scorer.py) the tree is ranked by its parent-aware edge scores
instead of the marginals alone; scoring a round's grid counts as "tree" time. With a per-round
budget rule (config.block.rule, decoder/graft/budget.py) the tree is built at the rule's cap and the
round verifies its first B_t nodes (`round_tree`, which the exact walk of collectors/graft/walk.py
also calls); the decision counts as "tree" time.
"""

from __future__ import annotations

import numpy as np

from decoder.core.config import BlockConfig, DecodeConfig
from decoder.core.device_rows import next_token
from decoder.core.outcome import GenerationResult, Output
from decoder.core.records import RoundStats
from decoder.core.timing import make_clock, no_clock, zero_times
from decoder.core.tree import DraftTree
from decoder.core.verify import TargetVerifier
from decoder.graft.block import BlockProposer, Marginals
from decoder.graft.budget import first_nodes, rule_budget
from decoder.graft.ddtree import EdgeScores, build_ddtree
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair


def round_tree(
    root: int,
    marginals: Marginals,
    block: BlockConfig,
    vocab_size: int | None,
    edges: EdgeScores | None,
    prev_accepted: int,
) -> DraftTree:
    """The tree a round verifies: DDTree at block.budget, or under block.rule its first B_t nodes
    of the tree built at the rule's cap (prev_accepted: the previous round's accepted drafted
    tokens, 0 in the first round)."""
    tree = build_ddtree(root, marginals.ids, marginals.logps, block.build_budget, vocab_size, edges)
    if block.rule is None:
        return tree
    return first_nodes(tree, rule_budget(tree, marginals.first_logp, prev_accepted, marginals.k, block.rule))


def ddtree_generate(
    pair: ModelPair,
    prompt: list[int],
    proposer: BlockProposer,
    config: DecodeConfig,
    timing: bool,
    edge_scorer: EdgeScorer | None = None,
) -> GenerationResult:
    """Rounds of propose marginals -> DDTree -> verify; proposer time is recorded as 'mid'."""
    wall = make_clock(pair.target.device)
    clock = wall if timing else no_clock
    rng = np.random.default_rng(config.seed)
    t_start = wall()
    layers = tuple(proposer.target_layers)
    verifier = TargetVerifier(pair.target, pair.vocab_size, config.tree.topk, layers)
    head = verifier.prefill(prompt)
    committed = list(prompt)
    out = Output(config.max_new_tokens, pair.eos_token_ids)
    first = next_token(head.logits, config.temperature, rng)  # as the baseline's prefill yields it
    out.emit([first])
    if not out.done:
        committed.append(first)
    prefill_s = wall() - t_start
    rounds: list[RoundStats] = []
    prev_accepted = 0
    while not out.done:
        times = zero_times()
        t0 = clock()
        marginals = proposer.propose(verifier.features if layers else None, committed, config.block.topk)
        t1 = clock()
        if marginals.k > proposer.k:
            raise ValueError(
                f"block proposer returned {marginals.k} positions, more than its k = {proposer.k}"
            )
        edges = (
            None
            if edge_scorer is None
            else edge_scorer.for_round(committed[-1], marginals.ids, marginals.logps)
        )
        tree = round_tree(committed[-1], marginals, config.block, pair.vocab_size, edges, prev_accepted)
        t2 = clock()
        if len(tree) == 1:  # nothing drafted (a budget of 0): the autoregressive step, as AR runs it
            verdict = verifier.step(tree.tokens[0], config.temperature, rng)
        else:
            verdict = verifier.verify(tree, config.temperature, rng)
        t3 = clock()
        new = [tree.tokens[a] for a in verdict.accepted] + [verdict.bonus]
        prev_accepted = len(verdict.accepted)
        emitted = out.emit(new)
        if not out.done:
            committed.extend(new)
        times.update(mid=t1 - t0, tree=t2 - t1, verify=t3 - t2)
        n = len(tree) - 1
        rounds.append(RoundStats(min(len(verdict.accepted), emitted), emitted, n, n, (), times))
    return GenerationResult(out.tokens, rounds, prefill_s, wall() - t_start, out.hit_eos)
