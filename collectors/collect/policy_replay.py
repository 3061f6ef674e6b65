"""Replay of one scheduler (a learned policy, or any callable) at temperature 0, without verification.

Why it is exact: as in collectors/collect/replay.py, lossless decoding commits the target's greedy
continuation g, and a round from L committed tokens accepts the longest path of its pruned tree
that spells g[L:]. The scheduler is asked before each step with the StepContext that
``decoder.construct.RoundBuilder.build`` would give it (same tree, same history, same runtime
facts; ``start_generation`` before each prompt, as ``generate`` does), so it makes the decisions
it makes in ``generate``, and the counts (verified nodes, mid call tokens, catch-up, small steps,
decisions taken) are execute mode's. tests/test_policy_replay.py checks this against ``generate``
round by round (tests/test_skip_rounds.py with the cross-round backoff).

What is shared with the all-schedules replay: the continuation g and the target's rows (one
``ReplayInputs`` per prompt serves every policy), the mid drafter's KV of the committed text, and
the walk's accounting (``Walk``).
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.collect.branch_mid import BranchMid, batch_rescore, committed_kv
from collectors.collect.records import RoundRecord
from collectors.collect.replay import Branch, Replayer, ReplayInputs, read_log
from collectors.collect.trajectory import Walk
from decoder.construct import RoundBuilder
from decoder.mid import TreeScores
from decoder.outcome import first_round_start
from decoder.policies import (
    RuntimeContext,
    Scheduler,
    StepContext,
    decision_taken,
    start_generation,
)
from decoder.state import step_signals


@dataclass(frozen=True)
class PolicyTrajectory:
    rounds: list[RoundRecord]
    n_tokens: int
    bits: list[tuple[bool, ...]]  # the policy's decisions in each round, step 1 first


def replay_policy(
    replayer: Replayer, inputs: ReplayInputs, policy: Scheduler, runtime: RuntimeContext | None
) -> PolicyTrajectory:
    """One scheduler's trajectory over one prompt, round by round, as ``generate`` would decode it."""
    cfg, pair = replayer.config.tree, replayer.pair
    text, depth = inputs.text, cfg.depth
    start_generation(policy)  # as generate does: per-prompt scheduler state starts afresh
    ngram = replayer.ngram_with_rows(inputs.prompt, text)
    builder = RoundBuilder(cfg, ngram, None, lambda: 0.0)
    log = read_log(builder)
    ngram.commit(inputs.prompt)
    walk, start, bits = Walk(), first_round_start(inputs.prompt), []
    left = inputs.round_tokens
    if left <= 0:
        return PolicyTrajectory([], 0, [])
    while True:
        ngram.commit(text[len(ngram.index.tokens) : start])
        committed = text[:start]
        b = Branch((), builder.new_state(committed), BranchMid(TreeScores()), (), ())
        lag = (start - 1) - walk.mid_committed  # what generate's RoundBuilder.mid_lag gives
        decisions = 0
        for k in range(1, depth + 1):
            signals = (*b.signals, step_signals(b.state, cfg.width))
            use_mid = bool(policy(StepContext(k, depth, b.bits, b.state, runtime, lag)))
            decisions += decision_taken(policy)
            if use_mid:
                if inputs.mid_kv is None:
                    raise ValueError("the policy calls the mid drafter but the pair has none")
                context = committed_kv(inputs.mid_kv, start - 1)
                batch_rescore(pair.mid, pair.vocab_size, context, start - 1, [(b.state.tree, b.mid)])
                rec = builder.mid_step(b.state, committed, k, b.mid)
                calls = (*b.calls, rec.mid_tree_tokens)
                b = Branch((*b.bits, True), b.state, b.mid, calls, signals, b.blocks)
            else:
                builder.small_step(b.state, committed, k)
                b = Branch((*b.bits, False), b.state, b.mid, b.calls, signals, b.blocks | log.take())
        nxt = walk.advance(replayer.finish(b, text, start), start, left, b.bits, decisions)
        bits.append(b.bits)
        if nxt is None:
            return PolicyTrajectory(walk.rounds, walk.emitted, bits)
        start = nxt
