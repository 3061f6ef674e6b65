"""Replay of one scheduler (a learned policy, or any callable) at temperature 0, without verification.

Why it is exact: as in collectors/collect/replay.py, lossless decoding commits the target's greedy
continuation g, and a round from L committed tokens accepts the longest path of its pruned tree
that spells g[L:]. The scheduler is asked before each step with the StepContext that
``decoder.core.construct.RoundBuilder.build`` would give it (same tree, same history, same runtime
facts; ``start_generation`` before each prompt, as ``generate`` does), so it makes the decisions
it makes in ``generate``, and the counts (verified nodes, mid call tokens, catch-up, small steps,
decisions taken) are execute mode's. tests/test_policy_replay.py checks this against ``generate``
round by round (tests/test_skip_rounds.py with the cross-round backoff).

What is shared with the all-schedules replay: the continuation g and the target's rows (one
``ReplayInputs`` per prompt serves every policy), the mid drafter's KV of the committed text, and
the walk's accounting (``Walk``).

What policies share with each other (``StepMemo``, one per prompt): a branch after a step is a
function of the round's start and the bits taken so far, not of the policy that took them (the
tree, its mid rows and fed KV, the call sizes, the signals, the prompt-row blocks its small steps
read; a scheduler's lookahead reads no rows). So policies replayed on one prompt that agree on a
prefix of a round's bits (the student at nearby thresholds mostly do) draft it once: a later
policy takes a copy of the branch the first one built. The trajectories are the ones each policy
replays alone (tests/test_policy_replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from collectors.collect.branch import Branch, read_log
from collectors.collect.branch_mid import BranchMid, batch_rescore, committed_kv
from collectors.collect.records import RoundRecord, round_stats
from collectors.collect.replay import Replayer, ReplayInputs
from collectors.collect.trajectory import Walk
from decoder.core.construct import RoundBuilder
from decoder.core.mid import TreeScores
from decoder.core.outcome import first_round_start
from decoder.core.policies import (
    Lookahead,
    RuntimeContext,
    Scheduler,
    StepContext,
    decision_taken,
    round_done,
    start_generation,
)
from decoder.core.state import step_signals

StepKey = tuple[int, tuple[bool, ...]]  # (round start, the bits of steps 1..k)


class StepMemo(dict[StepKey, Branch]):
    """One prompt's branches after each step, by (round start, bits so far): shared by the policies
    replayed on that prompt (module docstring). Holds private copies; hands out copies."""

    def take(self, key: StepKey, ngram: Lookahead | None) -> Branch | None:
        """A copy of the branch kept at ``key``, its lookahead the caller's own n-gram drafter (the
        one that kept it has moved on to later rounds)."""
        kept = self.get(key)
        if kept is None:
            return None
        b = _copy(kept)
        b.state.ngram = ngram
        return b

    def keep(self, key: StepKey, b: Branch) -> None:
        self[key] = _copy(b)

    def fill(self, replayer: Replayer, inputs: ReplayInputs) -> dict[int, list[Branch]]:
        """Batched replay: every schedule's branch after every step at every round start of the
        prompt, grown together (Replayer.grow_all), so that no policy replayed on it runs a mid
        forward of its own. The grown branches are never changed afterwards, so they are kept as
        they are; :meth:`take` hands out copies. Returns the branches after the last step (the
        all-schedules replay's, Replayer.replay_prompt ``grown``)."""

        def keep(start: int, b: Branch) -> None:
            self[(start, b.bits)] = b

        return replayer.grow_all(inputs, keep=keep)


def _copy(b: Branch) -> Branch:
    """A branch whose tree, node sets and mid bookkeeping are its own (row stores and KV tensors are
    shared: they are replaced, never written in place); ``pending`` is kept as it was."""
    mid = replace(b.mid, scores=b.mid.scores.copy())
    return Branch(b.bits, b.state.copy(), mid, b.calls, b.signals, b.blocks)


@dataclass(frozen=True)
class PolicyTrajectory:
    rounds: list[RoundRecord]
    n_tokens: int
    bits: list[tuple[bool, ...]]  # the policy's decisions in each round, step 1 first


def replay_policy(
    replayer: Replayer,
    inputs: ReplayInputs,
    policy: Scheduler,
    runtime: RuntimeContext | None,
    memo: StepMemo | None = None,
) -> PolicyTrajectory:
    """One scheduler's trajectory over one prompt, round by round, as ``generate`` would decode it.
    ``memo``: the prompt's StepMemo, shared by every policy replayed on ``inputs`` (never across
    prompts or pairs)."""
    cfg, pair = replayer.config.tree, replayer.pair
    text, depth = inputs.text, cfg.depth
    if memo is None and inputs.forest is not None:  # batched: grow the prompt's branches once
        memo = StepMemo()
        memo.fill(replayer, inputs)
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
            key = (start, (*b.bits, use_mid))
            kept = None if memo is None else memo.take(key, b.state.ngram)
            if kept is not None:
                b = kept
                continue
            if use_mid:
                if inputs.mid_kv is None:
                    if inputs.forest is not None:
                        raise RuntimeError(f"batched replay: the StepMemo lacks {key} (StepMemo.fill first)")
                    raise ValueError("the policy calls the mid drafter but the pair has none")
                context = committed_kv(inputs.mid_kv, start - 1)
                batch_rescore(pair.mid, pair.vocab_size, context, start - 1, [(b.state.tree, b.mid)])
                rec = builder.mid_step(b.state, committed, k, b.mid)
                calls = (*b.calls, rec.mid_tree_tokens)
                b = Branch((*b.bits, True), b.state, b.mid, calls, signals, b.blocks)
            else:
                builder.small_step(b.state, committed, k)
                b = Branch((*b.bits, False), b.state, b.mid, b.calls, signals, b.blocks | log.take())
            if memo is not None:
                memo.keep(key, b)
        nxt = walk.advance(replayer.finish(b, text, start), start, left, b.bits, decisions)
        round_done(policy, round_stats(walk.rounds[-1], b.bits))  # as generate does after a round
        bits.append(b.bits)
        if nxt is None:
            return PolicyTrajectory(walk.rounds, walk.emitted, bits)
        start = nxt
