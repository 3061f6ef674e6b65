"""Priced evaluation of one (pair, dataset) cell by replay: exact counts x the pair's latency profile.

Contract: every method runs on the same held-back prompts. Per prompt the target's greedy
continuation is computed once (``Replayer.inputs``); all 2^D fixed schedules (only the named ones
where no best fixed schedule in hindsight is asked for: the pair check) come from one
all-schedules replay and each learned policy from ``collectors.collect.policy_replay`` (exact at temperature
0, checked against real decoding in tests/test_policy_replay.py). A method's priced time per prompt
is the sum of its priced rounds; fixed schedules make no decisions at run time, so they pay no
scheduler cost. Autoregressive decoding is priced as n_tokens one-token steps.

What depends only on the target is computed once per prompt and shared (``TargetMemo``): the
continuation g with its stop, and the n-gram drafter holding the target's rows, which the
all-schedules replay and every policy replay would otherwise each recompute (a prefill and a block
forward of the text). A memo passed to several cells whose pairs share the target (zoo-l and zoo-lw)
serves all of them; the mid drafter's KV is the pair's own and is never shared.

The speedup over AR is a ratio of sums over prompts (every method emits the same tokens); its 95%
interval is a bootstrap over prompts (the same resamples for every method). The best fixed schedule
in hindsight is the argmax of priced tokens/s over the 2^D schedules on these very prompts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from collectors.collect.policy_replay import StepMemo, replay_policy
from collectors.collect.records import RoundRecord, bits_text
from collectors.collect.replay import Replayer
from collectors.collect.target_rows import TargetRows, drafter_from_rows, drafter_rows
from collectors.evaluation.bootstrap import paired_interval, ratio_of_sums
from decoder.core.config import DecodeConfig
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import FixedSchedule, RuntimeContext, parse_policy, schedule_bits
from decoder.deploy.latency import LatencyProfile, price_ar, price_round
from decoder.io.json_manifest import digest_json
from decoder.models.pair import ModelPair

FIXED = {"all-small": "00000", "all-mid": "11111"}


@dataclass(frozen=True)
class PricedMethod:
    """One method over a prompt set: per-prompt priced ms and tokens, and its rounds' statistics."""

    name: str
    schedule: str  # bit string for a fixed schedule, "" for a learned policy
    ms: np.ndarray  # (n_prompts,) priced decoding ms
    tokens: np.ndarray  # (n_prompts,) tokens emitted
    accepted: float  # mean accepted drafted tokens per round
    mid_calls_per_step: tuple[float, ...]  # share of rounds calling the mid drafter at step k
    # (n_passes, n_prompts): the same rounds priced under each pass of the profile stage (None: not
    # priced per pass); the headline's spread over machine speed (collectors/evaluation/headline.py)
    pass_ms: np.ndarray | None = None


Replayed = tuple[list[RoundRecord], int, list[tuple[bool, ...]]]  # rounds, tokens, bits per round
Cell = tuple[str, str]  # (pair_id, dataset_id)
Continuation = tuple[tuple[int, ...], int]  # the target's greedy continuation g and its stop


def _priced(
    name: str,
    schedule: str,
    per_prompt: Sequence[Replayed],
    profile: LatencyProfile,
    decisions: bool,
    passes: Sequence[LatencyProfile] = (),
) -> PricedMethod:
    ms, tokens, rounds, bits = [], [], [], []
    by_pass: list[list[float]] = [[] for _ in passes]
    for recs, n, round_bits in per_prompt:
        counts = [r.counts() if decisions else replace(r.counts(), decisions=0) for r in recs]
        ms.append(sum(price_round(profile, c) for c in counts))
        for one, out in zip(passes, by_pass, strict=True):
            out.append(sum(price_round(one, c) for c in counts))
        tokens.append(n)
        rounds += recs
        bits += round_bits
    per_step = np.mean(np.asarray(bits, dtype=float), axis=0) if bits else np.zeros(0)
    return PricedMethod(
        name,
        schedule,
        np.asarray(ms, dtype=float),
        np.asarray(tokens, dtype=float),
        float(np.mean([r.accepted for r in rounds])) if rounds else 0.0,
        tuple(float(x) for x in per_step),
        np.asarray(by_pass, dtype=float).reshape(len(passes), len(ms)) if passes else None,
    )


def bootstrap_speedup(
    ar_ms: np.ndarray, ms: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(point, low, high): sum(ar_ms) / sum(ms) and its 95% percentile bootstrap over prompts.

    A resample draws prompts with replacement, each keeping its own (ar_ms, ms) pair; the draws
    depend only on ``seed``, ``n_boot`` and the prompt count, so every method of one cell gets the
    same resamples. With one prompt there is nothing to resample: the interval is the point.
    """
    return paired_interval((ar_ms, ms), ratio_of_sums, n_boot, seed)


@dataclass
class TargetMemo:
    """Per prompt, what depends only on the target: g and its stop, the drafter with the target's
    rows (kept unused: every replay gets a copy). Serves one target (weights, dtype, device)."""

    owner: tuple | None = None
    continuations: dict[tuple, tuple[list[int], int]] = field(default_factory=dict)
    rows: dict[tuple, NgramDrafter] = field(default_factory=dict)

    def check(self, pair: ModelPair) -> None:
        t = pair.target
        owner = (getattr(t.config, "_name_or_path", "") or id(t), str(t.dtype), str(t.device))
        if self.owner is None:
            self.owner = owner
        elif self.owner != owner:
            raise ValueError(f"a TargetMemo of target {self.owner} was handed target {owner}")


class MemoReplayer(Replayer):
    """A Replayer that takes g and the target's rows from a TargetMemo, computing each once."""

    def __init__(
        self,
        pair: ModelPair,
        config: DecodeConfig,
        schedules,
        memo: TargetMemo,
        round_table_stride: int = 0,
        profile: LatencyProfile | None = None,
        batch_rows: int = 0,
    ) -> None:
        super().__init__(pair, config, schedules, round_table_stride, profile, batch_rows)
        memo.check(pair)
        self.memo = memo
        # g and the rows do not depend on the verification budget (lossless decoding commits the
        # target's greedy tokens whatever tree it verifies): pairs of one target share them.
        self._facts = (pair.eos_token_ids, pair.context_len, pair.vocab_size,
                       replace(config, tree=replace(config.tree, budget=1)))  # fmt: skip

    def warm(self, prompts: list[list[int]]) -> None:
        """Replayer.warm for the prompts whose g the memo does not hold yet."""
        super().warm([p for p in prompts if (tuple(p), self._facts) not in self.memo.continuations])

    def continuation(self, prompt: list[int]) -> tuple[list[int], int]:
        key = (tuple(prompt), self._facts)
        if key not in self.memo.continuations:
            self.memo.continuations[key] = super().continuation(prompt)
        g, limit = self.memo.continuations[key]
        return list(g), limit

    def seed(
        self,
        prompts: Sequence[list[int]],
        continuations: Sequence[Continuation],
        rows: Sequence[TargetRows] | None = None,
    ) -> None:
        """Hand the memo the prompts' g and stop computed earlier (a stored fixed part), so they are
        not decoded again; a continuation the memo already holds must be the same. With ``rows``
        (the same part's), the target's rows too: then no target forward runs for these prompts."""
        if rows is not None and len(rows) != len(prompts):
            raise ValueError(f"stored rows of {len(rows)} prompts for {len(prompts)} prompts")
        for i, (prompt, (g, limit)) in enumerate(zip(prompts, continuations, strict=True)):
            key, value = (tuple(prompt), self._facts), (list(g), int(limit))
            if self.memo.continuations.setdefault(key, value) != value:
                raise ValueError("a stored continuation differs from the one the memo holds")
            if rows is not None:
                text = (*prompt, *g)
                self.memo.rows.setdefault(
                    (tuple(prompt), text, self._facts),
                    drafter_from_rows(self.config.tree, prompt, text, rows[i]),
                )

    def _memo_drafter(self, prompt: list[int], text: list[int]) -> NgramDrafter:
        """The memo's drafter with the target's rows of ``text`` (computed now if it holds none);
        the memo's own object, not a copy."""
        key = (tuple(prompt), tuple(text), self._facts)
        if key not in self.memo.rows:
            self.memo.rows[key] = super().ngram_with_rows(prompt, text)
        return self.memo.rows[key]

    def rows_of(self, prompt: list[int], text: list[int]) -> TargetRows:
        """The target's rows of ``text`` as the memo holds them, for a stored part to hand to
        :meth:`seed`."""
        return drafter_rows(self._memo_drafter(prompt, text), text)

    def ngram_with_rows(self, prompt: list[int], text: list[int]) -> NgramDrafter:
        return copy.deepcopy(self._memo_drafter(prompt, text))


@dataclass(frozen=True)
class PricedCell:
    ar_ms: np.ndarray
    tokens: np.ndarray
    methods: dict[str, PricedMethod]
    best_fixed: str  # bit string of the best fixed schedule in hindsight ("" when not replayed)
    continuations: tuple[Continuation, ...] = ()  # per prompt, the target's g and its stop
    prompts_sha256: str = ""  # of the prompts' token ids (:func:`prompts_digest`)
    rows: tuple[TargetRows, ...] = ()  # per prompt, the target's rows of prompt + g
    pass_ar_ms: np.ndarray | None = None  # (n_passes, n_prompts): AR priced under each pass

    def speedups(self, n_boot: int = 2000, seed: int = 0) -> dict[str, tuple[float, float, float]]:
        return {n: bootstrap_speedup(self.ar_ms, m.ms, n_boot, seed) for n, m in self.methods.items()}


def prompts_digest(prompts: Sequence[Sequence[int]]) -> str:
    """sha256 of a cell's prompts (their token ids, in order)."""
    return digest_json([[int(t) for t in p] for p in prompts])


def merge_parts(fixed: PricedCell, learned: PricedCell) -> PricedCell:
    """One cell from its two parts on the same prompts: ``fixed`` (the fixed schedules, priced
    without policies) and ``learned`` (the policies, replayed from ``fixed``'s continuations);
    equal to pricing both in one pass (tests/test_fixed_cells.py)."""
    same = (
        fixed.prompts_sha256 == learned.prompts_sha256
        and fixed.continuations == learned.continuations
        and np.array_equal(fixed.ar_ms, learned.ar_ms)
        and np.array_equal(fixed.tokens, learned.tokens)
        and _same_passes(fixed.pass_ar_ms, learned.pass_ar_ms)
    )
    if not same:
        raise ValueError("the fixed and learned parts of a cell come from different prompts or targets")
    clash = sorted(set(fixed.methods) & set(learned.methods))
    if clash:
        raise ValueError(f"methods {clash} are in both parts of a cell")
    return replace(fixed, methods={**fixed.methods, **learned.methods})


def _same_passes(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None) == (b is None) and (a is None or np.array_equal(a, b))


def _fixed_schedules(fixed: dict[str, str], depth: int) -> dict[str, FixedSchedule]:
    """Each fixed method's schedule (decoder.core.policies.parse_policy: bit strings, 'all-small',
    'all-mid'); a ValueError names a method that is not a fixed schedule."""
    out = {}
    for name, policy in fixed.items():
        parsed = parse_policy(policy, depth)
        if not isinstance(parsed, FixedSchedule):
            raise ValueError(f"fixed method {name!r}: {policy!r} is not a fixed schedule")
        out[name] = parsed
    return out


def priced_cell(
    pair: ModelPair,
    prompts: list[list[int]],
    config: DecodeConfig,
    profile: LatencyProfile,
    runtime: RuntimeContext | Sequence[RuntimeContext],
    policies: dict[str, Callable],
    fixed: dict[str, str],
    progress: Callable[[], None] | None = None,
    memo: TargetMemo | None = None,
    hindsight: bool = True,
    continuations: Sequence[Continuation] | None = None,
    rows: Sequence[TargetRows] | None = None,
    batch_rows: int = 0,
    passes: Sequence[LatencyProfile] = (),
) -> PricedCell:
    """Replay the fixed schedules and every policy on every prompt; price them with the profile
    (and, with ``passes``, under each pass of the profile stage too: no extra replay).

    ``runtime``: the learned policies' runtime context, one for all prompts or one per prompt.

    ``fixed``: method name -> bit string; ``policies``: method name -> scheduler; ``memo``: shared
    with the other cells of this target (default: this cell's own). ``hindsight``: replay all 2^D
    schedules and add the best one on these prompts as "best-fixed"; without it only the schedules
    of ``fixed`` are replayed (each schedule's rounds are the same either way: a walk depends on its
    own bits only) and ``best_fixed`` is "". With neither (``fixed`` empty and no hindsight) no
    fixed schedule is replayed: the policies' part of a cell (:func:`merge_parts`).

    ``continuations``: the prompts' g and stop from an earlier pricing of these prompts with this
    target (a stored fixed part's), taken instead of decoding them again; ``rows``: that part's
    target rows too, so that no target forward runs (the cell is the same either way).
    ``batch_rows``: the replay's (collectors.collect.replay.Replayer); batched, each prompt's
    branches are grown once for the fixed schedules and every policy together (StepMemo.fill).
    """
    depth = config.tree.depth
    named = _fixed_schedules(fixed, depth)
    if hindsight:
        schedules = [schedule_bits(s, depth) for s in range(2**depth)]
    else:
        schedules = list(dict.fromkeys(p.bits for p in named.values()))
    memo = TargetMemo() if memo is None else memo
    replayer = MemoReplayer(pair, config, schedules, memo, profile=profile, batch_rows=batch_rows)
    if continuations is not None:
        replayer.seed(prompts, continuations, rows)
    elif rows is not None:
        raise ValueError("stored rows come with their continuations")
    per_schedule: list[list[Replayed]] = [[] for _ in schedules]
    per_policy: dict[str, list[Replayed]] = {n: [] for n in policies}
    ar_ms, tokens = [], []
    runtimes = list(runtime) if isinstance(runtime, Sequence) else [runtime] * len(prompts)
    if len(runtimes) != len(prompts):
        raise ValueError(f"{len(runtimes)} runtime contexts for {len(prompts)} prompts")
    replayer.warm(prompts)
    gs, target_rows = [], []
    for prompt, rt in zip(prompts, runtimes, strict=True):
        inputs = replayer.inputs(prompt)
        gs.append((tuple(inputs.text[len(prompt) :]), inputs.limit))
        if continuations is None:  # a seeded pass's rows are its stored part's (merge_parts keeps them)
            target_rows.append(replayer.rows_of(prompt, inputs.text))
        steps = StepMemo()  # this prompt's drafting steps, shared by its policies
        grown = steps.fill(replayer, inputs) if replayer.batch_rows and policies else None
        if schedules:
            rep = replayer.replay_prompt(prompt, inputs, grown)
            for s in range(len(schedules)):
                per_schedule[s].append((rep.rounds[s], rep.n_tokens[s], [schedules[s]] * len(rep.rounds[s])))
        for name, policy in policies.items():
            traj = replay_policy(replayer, inputs, policy, rt, steps)
            per_policy[name].append((traj.rounds, traj.n_tokens, traj.bits))
        emitted = {per_schedule[s][-1][1] for s in range(len(schedules))} | {
            v[-1][1] for v in per_policy.values()
        }
        if emitted != {inputs.round_tokens}:
            raise RuntimeError(
                f"replays emitted {sorted(emitted)} tokens, expected {inputs.round_tokens} for every method"
            )
        tokens.append(inputs.round_tokens)  # both sides get the first token from the prefill
        ar_ms.append(price_ar(profile, inputs.round_tokens))
        if progress is not None:
            progress()
    all_fixed = [
        _priced(bits_text(b), bits_text(b), per_schedule[s], profile, False, passes)
        for s, b in enumerate(schedules)
    ]
    by_text = {m.schedule: m for m in all_fixed}
    methods = {name: replace(by_text[p.text], name=name) for name, p in named.items()}
    best_fixed = ""
    if hindsight:
        rate = [m.tokens.sum() / m.ms.sum() for m in all_fixed]
        best = max(range(len(all_fixed)), key=lambda s: (rate[s], -s))
        methods["best-fixed"] = replace(all_fixed[best], name="best-fixed")
        best_fixed = all_fixed[best].schedule
    methods |= {n: _priced(n, "", per_policy[n], profile, True, passes) for n in policies}
    ar, n_tokens = np.asarray(ar_ms, dtype=float), np.asarray(tokens, dtype=float)
    pass_ar = np.asarray([[price_ar(p, int(n)) for n in tokens] for p in passes], dtype=float)
    return PricedCell(
        ar, n_tokens, methods, best_fixed, tuple(gs), prompts_digest(prompts), tuple(target_rows),
        pass_ar.reshape(len(passes), len(tokens)) if passes else None,
    )  # fmt: skip


ENDPOINTS = ("all-small", "all-mid")


def pooled_speedups(cells: Sequence[PricedCell], methods: Sequence[str]) -> dict[str, float]:
    """Per method, the speedup over AR pooled over the cells: every prompt's AR ms summed over the
    method's ms summed (so a long prompt weighs as much as its time)."""
    ar = sum(float(c.ar_ms.sum()) for c in cells)
    return {m: ar / sum(float(c.methods[m].ms.sum()) for c in cells) for m in methods}


def fastest(speedup: Mapping[str, float], methods: Sequence[str]) -> str:
    """The fastest of ``methods`` by ``speedup``, the first listed among equals."""
    if not methods:
        raise ValueError("fastest: no methods")
    best = max(speedup[m] for m in methods)
    return next(m for m in methods if speedup[m] >= best)
