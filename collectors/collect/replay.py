"""Replay mode: all 2^D schedules from every visited round start, without target verification.

Why it is exact at temperature 0: decoding is lossless, so every schedule commits the same text,
the target's greedy continuation g. A round starting after L committed tokens accepts exactly the
longest path of its pruned tree that spells g[L:], so no verification forward is needed.

What is shared: g and the target's top-m log-probs at every position are computed once per prompt
(prompt rows by the same prefill as execute mode; g of a set of prompts in batches by ``warm``, each
checked against the unbatched target forwards that give its rows, and decoded alone where the check
fails); the mid drafter's KV of the committed text is computed once per prompt and handed to each
round start; tree construction is shared between schedules with the same prefix (a depth-first walk
over the 2^D schedules, branching the tree and the mid drafter's per-round state). The mid drafter
forwards each distinct token path of a round start once, whichever schedules' trees hold it
(collectors/collect/trie_mid.py: a node's mid row depends only on the context and its path); every schedule
is still charged for all the nodes a real decoder would forward for it.

Each schedule's trajectory then walks from start to start (L -> L + A + 1) through the memoised
outcomes, with the same stopping rules and the same mid catch-up accounting as execute mode
(collectors/collect/trajectory.py). The first new token comes from the prefill (decoder/core/verify.py),
so the first round starts after it.

Prompt rows: decoding computes a block of the prompt's top-m rows the first time an n-gram step
reads a position of it (decoder/core/verify.py PromptRows). Replay holds every row up front and logs
which blocks each branch's small steps read (`ReadLog`); a trajectory's round is charged the blocks
no earlier round of that trajectory read (trajectory.Walk), which is what decoding computes in that
round.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, replace

from transformers import DynamicCache

from collectors.collect.batch_greedy import NOT_GREEDY, GreedyCheck, greedy_batch
from collectors.collect.branch import Branch, ReadLog, read_log
from collectors.collect.branch_mid import KV, committed_kv
from collectors.collect.forest import MidForest
from collectors.collect.grow import fork_starts, grow_starts
from collectors.collect.target_rows import TargetRows, drafter_rows
from collectors.collect.trajectory import (
    BranchOutcome,
    PromptReplay,
    Walk,
    accepted_along,
    arrival,
    small_frontier,
)
from collectors.collect.trie_mid import RoundTrie, TrieBranchMid
from decoder.core.budget import verify_budget
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.mid import TreeScores
from decoder.core.ngram import NgramDrafter
from decoder.core.outcome import first_round_start
from decoder.core.state import step_signals
from decoder.core.tensors import causal_block, forward_block
from decoder.core.verify import TargetVerifier, top_logps
from decoder.deploy.latency import LatencyProfile
from decoder.generate import generate
from decoder.models.pair import ModelPair

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayInputs:
    """What every replay of one prompt shares: g, its stop, and the mid drafter's KV of the text."""

    prompt: list[int]
    text: list[int]  # prompt + greedy continuation (with the deepest tree's margin)
    limit: int  # tokens to emit (max_new_tokens, or up to the first EOS)
    mid_kv: DynamicCache | None  # one start at a time: the mid drafter's KV of the text
    forest: MidForest | None = None  # batched: every start's mid rows (collectors/collect/forest.py)

    @property
    def round_tokens(self) -> int:
        """Tokens the rounds emit: all but the first, which the prefill yields."""
        return self.limit - 1


def continuation_decoding(
    pair: ModelPair, profile: LatencyProfile | None, tree: TreeConfig
) -> tuple[str, TreeConfig]:
    """(policy, tree) that decodes a prompt's greedy continuation g. Every lossless decoder yields
    the same tokens, so this choice sets only the time: the mid drafter's sequential cascade (one
    chain, D one-token mid calls and a (D + 1)-node verify per round) where, by the pair's latency
    profile, those D calls cost less than one target forward of the root; All-Small (the n-gram
    tree, no mid) otherwise, and without a profile. On the embedded zoo the cascade takes 0.6x
    All-Small's time on the deep targets (target-l, target-chat-l), where it is chosen, and 2x on
    target-s, where it is not."""
    if (
        profile is not None
        and pair.mid is not None
        and profile.has_mid
        and tree.depth * profile.mid_ms(1) < profile.verify_ms(1)
    ):
        return "all-mid", replace(tree, sequential=True)
    return "all-small", tree


class Replayer:
    """Replays all schedules of one pair on one prompt at a time."""

    def __init__(
        self,
        pair: ModelPair,
        config: DecodeConfig,
        schedules: list[tuple[bool, ...]],
        round_table_stride: int = 1,
        profile: LatencyProfile | None = None,
        batch_rows: int = 0,
    ) -> None:
        """round_table_stride: every k-th visited start of a prompt gets all schedules (the round
        table); the others only grow the schedule prefixes whose trajectories pass through them.
        profile: the pair's latency profile, read only to choose how g is decoded
        (:func:`continuation_decoding`). batch_rows: 0 grows one round start at a time (one mid
        forward per start and step); n > 0 grows every start of a prompt together, its mid calls
        in forwards of at most n rows (collectors/collect/grow.py)."""
        if config.temperature != 0:
            raise ValueError("replay mode needs temperature 0 (greedy acceptance)")
        if round_table_stride < 0:
            raise ValueError(f"round_table_stride must be >= 0, got {round_table_stride}")
        if batch_rows < 0:
            raise ValueError(f"batch_rows must be >= 0, got {batch_rows}")
        self.pair, self.config, self.schedules = pair, config, schedules
        self.stride, self.batch_rows = round_table_stride, batch_rows
        self.index = {bits: i for i, bits in enumerate(schedules)}
        self.depth = config.tree.depth
        self.g_decoding = continuation_decoding(pair, profile, config.tree)
        self._warm: dict[tuple[int, ...], list[int]] = {}  # prompt -> its checked batched continuation
        # (prompt, text) -> the n-gram drafter with the target's rows that warm computed to check it
        self._rows: dict[tuple[tuple[int, ...], tuple[int, ...]], NgramDrafter] = {}

    def continuation_length(self, prompt: list[int]) -> int:
        """Tokens of g to decode: max_new_tokens plus a margin for the deepest tree, within the
        target's context."""
        cfg = self.config.tree
        room = self.pair.context_len - len(prompt) - self.config.max_new_tokens
        return self.config.max_new_tokens + max(0, min(cfg.depth * max(cfg.ngram_chain_len, 1) + 1, room))

    def warm(self, prompts: list[list[int]]) -> None:
        """Decode the continuations of ``prompts`` in batches (collectors/collect/batch_greedy.py) for
        :meth:`continuation` to take, with their n-gram drafters for :meth:`ngram_with_rows`. Each
        is checked against the unbatched target forwards that give its rows (:meth:`rows_and_check`),
        so the check costs no forward of its own; one that fails (a near-tie the batch broke the
        other way) is left to :meth:`continuation`'s own decode."""
        todo = [p for p in dict.fromkeys(tuple(p) for p in prompts) if p not in self._warm]
        if not todo:
            return
        lengths = [self.continuation_length(list(p)) for p in todo]
        target, vocab = self.pair.target, self.pair.vocab_size
        for prompt, n, g in zip(todo, lengths, greedy_batch(target, todo, max(lengths), vocab), strict=True):
            text = [*prompt, *g[:n]]
            ngram, wrong = self.rows_and_check(list(prompt), text)
            if wrong is None:
                self._warm[prompt] = g[:n]
                self._rows[prompt, tuple(text)] = ngram
            else:
                log.warning(NOT_GREEDY, wrong)

    def continuation(self, prompt: list[int]) -> tuple[list[int], int]:
        """The target's greedy continuation with a margin for the deepest tree (from :meth:`warm`
        where it was warmed, else decoded now); and its EOS stop."""
        g = self._warm.pop(tuple(prompt), None)
        if g is None:
            free = replace(self.pair, eos_token_ids=())
            policy, tree = self.g_decoding
            run = DecodeConfig(self.continuation_length(prompt), 0.0, self.config.seed, tree)
            g = generate(free, prompt, policy, run, timing=False).new_tokens
        eos = set(self.pair.eos_token_ids)
        limit = next((i + 1 for i, t in enumerate(g[: self.config.max_new_tokens]) if t in eos), None)
        return g, limit or self.config.max_new_tokens

    def inputs(self, prompt: list[int]) -> ReplayInputs:
        """The continuation g, its stop and the mid drafter's KV (batched: its forest): computed
        once, shared by replays."""
        g, limit = self.continuation(prompt)
        return self.inputs_of(prompt, prompt + g, limit)

    def inputs_of(self, prompt: list[int], text: list[int], limit: int) -> ReplayInputs:
        """:meth:`inputs` for a known text (prompt + continuation) and stop: the mid drafter's KV of
        the text, or (batched) its forest."""
        mid = self.pair.mid
        if self.batch_rows and mid is not None:
            forest = MidForest(mid, self.pair.vocab_size, text, len(prompt), self.batch_rows)
            return ReplayInputs(list(prompt), text, limit, None, forest)
        return ReplayInputs(list(prompt), text, limit, self.mid_kv_of(text) if mid is not None else None)

    def has_mid(self, inputs: ReplayInputs) -> bool:
        return inputs.mid_kv is not None or inputs.forest is not None

    def grow_all(
        self, inputs: ReplayInputs, prefixes: set[tuple[bool, ...]] | None = None, keep=None
    ) -> dict[int, list[Branch]]:
        """Batched: at every round start a trajectory of the prompt can reach, the branches of every
        schedule (or of the schedules whose prefixes are ``prefixes``) after the last step
        (collectors/collect/grow.py; ``keep`` sees every branch after every step)."""
        prompt, text = inputs.prompt, inputs.text
        p0 = first_round_start(prompt)
        ngram = self.ngram_with_rows(prompt, text)
        ngram.commit(prompt)
        builders = fork_starts(self.config.tree, ngram, text, range(p0, p0 + inputs.round_tokens))
        return grow_starts(self.config.tree, builders, inputs.forest, text, prefixes, keep)

    def outcomes_of(
        self, level: list[Branch], text: list[int], start: int, want: set[tuple[bool, ...]] | None = None
    ) -> list[BranchOutcome | None]:
        """The schedules' outcomes from their branches after the last step (None: not grown);
        a ValueError names schedules in ``want`` (default: all) that did not grow."""
        out: list[BranchOutcome | None] = [None] * len(self.schedules)
        for b in level:
            if b.bits in self.index:
                out[self.index[b.bits]] = self.finish(b, text, start)
        missing = [
            bits for bits in (self.schedules if want is None else want) if out[self.index[bits]] is None
        ]
        if missing:
            raise ValueError(f"schedules {missing[:3]} need a mid drafter but the pair has none")
        return out

    def replay_prompt(
        self,
        prompt: list[int],
        inputs: ReplayInputs | None = None,
        grown: dict[int, list[Branch]] | None = None,
    ) -> PromptReplay:
        """Every schedule's trajectory over the prompt, with the round table at every stride-th
        visited start. ``grown``: batched, the branches :meth:`grow_all` grew for these inputs
        (a policy replay's StepMemo.fill grows them too), taken instead of growing them again."""
        inputs = inputs or self.inputs(prompt)
        text, mid_kv = inputs.text, inputs.mid_kv
        p0 = first_round_start(prompt)
        starts: dict[int, list[BranchOutcome]] = {}
        left = inputs.round_tokens
        table = None
        if self.batch_rows and left > 0:
            grown = grown if grown is not None else self.grow_all(inputs, self.prefixes())
            table = {s: self.outcomes_of(level, text, s) for s, level in grown.items()}
            del grown
        else:
            ngram = self.ngram_with_rows(prompt, text)
            builder = RoundBuilder(self.config.tree, ngram, None, lambda: 0.0)
            ngram.commit(prompt)
        at: dict[int, list[int]] = {p0: list(range(len(self.schedules)))} if left > 0 else {}
        state = {s: Walk() for s in range(len(self.schedules))}
        heap = [p0] if left > 0 else []
        visited = 0
        lags: dict[int, int] = {}
        blocks: dict[int, frozenset[int]] = {}
        while heap:
            start = heapq.heappop(heap)
            full = self.stride > 0 and visited % self.stride == 0
            if table is not None:
                outcomes = table[start]
            else:
                ngram.commit(text[len(ngram.index.tokens) : start])
                context = committed_kv(mid_kv, start - 1) if mid_kv is not None else None
                needed = None if full else {self.schedules[s] for s in at[start]}
                outcomes = self._all_schedules(builder, context, text, start, needed)
            visited += 1
            if full:
                starts[start] = outcomes  # type: ignore[assignment]
                came = arrival([state[s] for s in at[start]], start)
                lags[start], blocks[start] = came.lag_at(start), frozenset(came.blocks_read)
            for s in at.pop(start):
                nxt = state[s].advance(outcomes[s], start, left, self.schedules[s])
                if nxt is not None:
                    if nxt not in at:
                        at[nxt] = []
                        heapq.heappush(heap, nxt)
                    at[nxt].append(s)
        return PromptReplay(
            {s: w.rounds for s, w in state.items()},
            {s: w.emitted for s, w in state.items()},
            starts,
            lags,
            blocks,
        )

    def prefixes(self) -> set[tuple[bool, ...]] | None:
        """Every prefix of the replayed schedules; None when they are all 2^D schedules."""
        if len(set(self.schedules)) == 2**self.depth:
            return None
        return {b[:k] for b in self.schedules for k in range(len(b) + 1)}

    def ngram_with_rows(self, prompt: list[int], text: list[int]) -> NgramDrafter:
        """An n-gram drafter whose score cache holds the target's rows for every position and logs
        the prompt-row blocks read (`ReadLog`): the one :meth:`warm` made for this text, once, else
        computed now."""
        warmed = self._rows.pop((tuple(prompt), tuple(text)), None)
        return warmed if warmed is not None else self.rows_and_check(prompt, text)[0]

    def rows_of(self, prompt: list[int], text: list[int]) -> TargetRows:
        """The target's rows of ``text`` (:func:`drafter_rows`): what a stored replay keeps so that a
        later one runs no target forward (collectors.evaluation.priced_eval.MemoReplayer.seed)."""
        return drafter_rows(self.ngram_with_rows(prompt, text), text)

    def rows_and_check(self, prompt: list[int], text: list[int]) -> tuple[NgramDrafter, int | None]:
        """The n-gram drafter of :meth:`ngram_with_rows`, from the prompt's prefill (as execute mode
        computes it) and one forward of the rest of the text but its last token; and the first
        token of the text after the prompt that is not the target's greedy choice in those forwards
        (None when every one is)."""
        cfg = self.config.tree
        vocab = self.pair.vocab_size
        verifier = TargetVerifier(self.pair.target, vocab, cfg.topk)
        prefill = verifier.prefill(prompt)
        start = len(prompt)
        logits = forward_block(self.pair.target, verifier.cache, causal_block(text[start:-1], start, start))
        tail = top_logps(logits[:, :vocab], cfg.topk, start)
        ngram = NgramDrafter.for_tree(cfg)
        ngram.cache = ReadLog(len(prompt))
        for rows in (prefill.top, tail):
            ngram.cache.set_rows(rows.start, rows.tokens, rows.logps)
        greedy = [int(prefill.logits[:vocab].argmax()), *logits[:, :vocab].argmax(-1).tolist()]
        return ngram, GreedyCheck(text[start:], greedy, None).wrong

    def mid_kv_of(self, text: list[int]) -> DynamicCache:
        cache = DynamicCache()
        forward_block(self.pair.mid, cache, causal_block(text[:-1], 0, 0))
        return cache

    def _all_schedules(
        self,
        builder: RoundBuilder,
        context: KV | None,
        text: list[int],
        start: int,
        needed: set[tuple[bool, ...]] | None = None,
    ) -> list[BranchOutcome | None]:
        """The schedules' outcomes at one start (:meth:`grow_one_start`); schedules not grown get
        None."""
        level = self.grow_one_start(builder, context, text, start, needed)
        return self.outcomes_of(level, text, start, needed)

    def grow_one_start(
        self,
        builder: RoundBuilder,
        context: KV | None,
        text: list[int],
        start: int,
        needed: set[tuple[bool, ...]] | None = None,
    ) -> list[Branch]:
        """Grow the schedules' trees at one start level by level (all, or only the prefixes of
        `needed`); the mid steps of one level share a forward of the paths new to the round's trie.
        Returns the branches after the last step."""
        prefixes = None if needed is None else {b[:k] for b in needed for k in range(len(b) + 1)}
        committed = text[:start]
        width = self.config.tree.width
        log = read_log(builder)
        log.take()
        level = [Branch((), builder.new_state(committed), TrieBranchMid(TreeScores()), (), ())]
        trie = None if context is None else RoundTrie(self.pair.mid, self.pair.vocab_size, context, start - 1)
        for k in range(1, self.depth + 1):
            nxt, invoking = [], []
            for b in level:
                sig = (*b.signals, step_signals(b.state, width))
                if prefixes is None or (*b.bits, False) in prefixes:
                    small = b.state.copy()
                    builder.small_step(small, committed, k)
                    read = b.blocks | log.take()
                    nxt.append(Branch((*b.bits, False), small, b.mid, b.calls, sig, read))
                if context is not None and (prefixes is None or (*b.bits, True) in prefixes):
                    mid = b.mid.copy()
                    invoking.append(Branch((*b.bits, True), b.state.copy(), mid, b.calls, sig, b.blocks))
            if invoking:
                assert trie is not None
                trie.rescore([(b.state.tree, b.mid) for b in invoking])
            for b in invoking:
                rec = builder.mid_step(b.state, committed, k, b.mid)
                calls = (*b.calls, rec.mid_tree_tokens)
                nxt.append(Branch(b.bits, b.state, b.mid, calls, b.signals, b.blocks | log.take()))
            level = nxt
        return level

    def finish(self, b: Branch, text: list[int], start: int) -> BranchOutcome:
        pruned = b.state.tree.prune(verify_budget(b.state.tree, self.config.tree))
        accepted = [int(pruned.source[a]) for a in accepted_along(pruned.tree, text, start)]
        fed = b.mid_fed(accepted)
        cfg = self.config.tree
        frontier = small_frontier(b.state.tree, b.bits, cfg.width, cfg.sequential)
        return BranchOutcome(
            len(accepted), len(pruned.tree), b.calls, fed, b.signals, b.state.tree.n_alive, frontier, b.blocks
        )
