"""One decode with a shared draft tree per round, and the autoregressive baseline.

decoder/generate.py's `generate` is the entry point for every policy; it runs tree policies here
and GRAFT's 'ddtree' in decoder/graft/decode.py.

Contract: a decode returns exactly the tokens the target would produce on its own (greedy:
token-identical to `model.generate(do_sample=False)` in fp32; in bf16/fp16 a tree forward and a
one-token forward differ in the last bits, so a near-tied argmax may flip: decoder/check_lossless.py
classifies every divergence; sampling: the same distribution). Output stops right after the first
EOS or at max_new_tokens, never later. Every method is timed with the same clock; per round we
record accepted length (drafted tokens that were emitted), tree sizes, mid calls and, when
`timing` is on, component times (each reading syncs an accelerator; off, only the wall clock does).

Refused before any model work: prompts that do not fit the context together with max_new_tokens
and the deepest draft tree (target and mid), and generation configs with logits processors
(repetition penalty, n-gram bans, ...) or, when sampling, warpers (top-k/top-p, ...), which this
runtime does not apply: silently ignoring them would not be the target's own output.

A round whose pruned tree holds no drafted node (nothing drafted, or the per-round budget rule chose
B = 0) runs as the baseline's own autoregressive step (TargetVerifier.step): no tree verify, no
mask. A policy wrapped in decoder.deploy.switch_off.SwitchOff may also keep speculation off for whole
rounds (no drafting, one autoregressive step); `GenerationResult.modes` counts both kinds.

The command line is decoder/cli.py (`python -m decoder --target PATH [--mid PATH] --prompt TEXT`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from decoder.core.budget import verify_budget
from decoder.core.config import DecodeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.device_rows import next_token
from decoder.core.mid import MidDrafter
from decoder.core.ngram import NgramDrafter
from decoder.core.outcome import GenerationResult, Output
from decoder.core.policies import (
    AR,
    RuntimeContext,
    Scheduler,
    round_done,
    round_speculates,
    uses_mid,
)
from decoder.core.records import DRAFTLESS, OFF, TREE, RoundStats
from decoder.core.tensors import causal_block, forward_block
from decoder.core.timing import make_clock, no_clock, zero_times
from decoder.core.tree import DraftTree
from decoder.core.verify import SteppingVerifier, TargetVerifier, Verdict, Verifier, decode_one
from decoder.models.pair import ModelPair, check_supported, context_of

Steps = Generator[
    None, None, GenerationResult
]  # a decode run piece by piece (decoder.generate.generate_steps)


def max_tree_depth(config: DecodeConfig) -> int:
    """Deepest drafted node a round can create: D steps, each adding at most a chain of tokens."""
    cfg = config.tree
    return cfg.depth * max(cfg.ngram_chain_len, 1)


# Generation-config fields that turn into logits processors (applied in greedy decoding too), with
# the value that means "off"; and the sampling-only warpers.
PROCESSORS = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "exponential_decay_length_penalty": None,
    "forced_decoder_ids": None,
    "guidance_scale": 1.0,
    "watermarking_config": None,
}
WARPERS = {
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
}


def unsupported_generation_settings(model: torch.nn.Module, temperature: float) -> dict[str, object]:
    """Generation-config settings that would change the model's own output but are not applied here."""
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return {}
    found = {}
    checks = {**PROCESSORS, **(WARPERS if temperature > 0 else {})}
    for name, off in checks.items():
        value = getattr(gc, name, off)
        if value is None or value == off or (isinstance(value, list | tuple | dict) and not value):
            continue
        found[name] = value
    return found


def check_prompt(pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, policy: object = None) -> None:
    """Reject bad input before any model work (policy None: assume a speculative one)."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt is empty: at least one token is needed")
    bad = [t for t in prompt_ids if not 0 <= int(t) < pair.vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside [0, {pair.vocab_size}): {bad[:5]}")
    speculative = policy != AR
    depth = max_tree_depth(config) if speculative else 0
    need = len(prompt_ids) + config.max_new_tokens + depth
    models = [("target", pair.target)]
    if speculative and pair.mid is not None and (policy is None or uses_mid(policy)):
        models.append(("mid drafter", pair.mid))
    for name, model in models:
        check_supported(model, name)  # also for pairs not built by make_pair
        room = context_of(model)
        if need > room:
            tree = f" + the deepest draft tree ({depth} tokens)" if depth else ""
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({config.max_new_tokens}){tree} "
                f"= {need} exceeds the {name}'s context of {room} tokens"
            )
    for name, model in models:
        found = unsupported_generation_settings(model, config.temperature)
        if found:
            settings = ", ".join(f"{k}={v!r}" for k, v in found.items())
            raise ValueError(
                f"the {name}'s generation config sets {settings}: this runtime does not apply logits "
                "processors or warpers, so its output would not be the model's own. Reset them "
                "(e.g. model.generation_config.repetition_penalty = 1.0) or edit generation_config.json"
            )


def drain(steps: Steps) -> GenerationResult:
    """Run a decode's steps to the end; its result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


def _with_cpu(result: GenerationResult, cpu0: float) -> GenerationResult:
    """``result`` with the CPU seconds since ``cpu0`` (time.process_time: every thread of this
    process, spin-waits included). A benchmark reports it beside wall time: work done in other
    threads shows in it, and so does contention, whose spinning threads burn CPU while they wait."""
    return dataclasses.replace(result, cpu_s=time.process_time() - cpu0)


def _speculative(
    pair: ModelPair,
    prompt: list[int],
    scheduler: Scheduler,
    config: DecodeConfig,
    runtime: RuntimeContext | None,
    timing: bool = True,
    verifier: Verifier | None = None,
) -> GenerationResult:
    """The draft-and-verify loop. `verifier` replaces the target's TargetVerifier: only the host-work
    benchmark (benchmarks/bench_decoder.py) passes one, to run this very loop without forwards."""
    return drain(_speculative_steps(pair, prompt, scheduler, config, runtime, timing, verifier))


def _speculative_steps(
    pair: ModelPair,
    prompt: list[int],
    scheduler: Scheduler,
    config: DecodeConfig,
    runtime: RuntimeContext | None,
    timing: bool = True,
    verifier: Verifier | None = None,
) -> Steps:
    """`_speculative`'s loop as steps: yields after the prefill and after every round."""
    cfg = config.tree
    wall = make_clock(pair.target.device)
    rng = np.random.default_rng(config.seed)
    t_start = wall()
    if verifier is None:
        verifier = TargetVerifier(pair.target, pair.vocab_size, cfg.topk)
    ngram = NgramDrafter.for_tree(cfg)
    mid = MidDrafter(pair.mid, pair.vocab_size) if pair.mid is not None and uses_mid(scheduler) else None
    head = verifier.prefill(prompt)
    ngram.commit(prompt)
    ngram.cache.set_source(head.rows)  # the prompt's rows, each block computed when first read
    committed = list(prompt)
    out = Output(config.max_new_tokens, pair.eos_token_ids)
    first = next_token(head.logits, config.temperature, rng)  # as the baseline's prefill yields it
    out.emit([first])
    if not out.done:
        ngram.commit([first])
        committed.append(first)
    clock = wall if timing else no_clock
    builder = RoundBuilder(cfg, ngram, mid, clock)
    loop = _RoundLoop(config, verifier, ngram, mid, builder, clock, rng, committed, out)
    prefill_s = wall() - t_start
    yield
    rounds: list[RoundStats] = []
    while not loop.out.done:
        stats = loop.tree_round(scheduler, runtime) if round_speculates(scheduler) else loop.off_round()
        rounds.append(stats)
        round_done(scheduler, stats)
        yield
    return GenerationResult(loop.out.tokens, rounds, prefill_s, wall() - t_start, loop.out.hit_eos)


@dataclass
class _RoundLoop:
    """One generation's round state: the drafters, the target side and what has been emitted."""

    config: DecodeConfig
    verifier: Verifier
    ngram: NgramDrafter
    mid: MidDrafter | None
    builder: RoundBuilder
    clock: Callable[[], float]
    rng: np.random.Generator
    committed: list[int]  # the prompt and every emitted token (the last one roots the next round)
    out: Output

    def tree_round(self, scheduler: Scheduler, runtime: RuntimeContext | None) -> RoundStats:
        """Draft a tree, prune it, verify it; a tree left with no drafted node after the prune runs
        as one autoregressive step instead (DRAFTLESS: same tokens, cache and score rows)."""
        times = zero_times()
        lag = self.builder.mid_lag(self.committed)
        blocks = self.ngram.cache.blocks_read
        tree, steps = self.builder.build(self.committed, scheduler, times, runtime)
        t0 = self.clock()
        pruned = tree.prune(verify_budget(tree, self.config.tree))
        t1 = self.clock()
        draftless = len(pruned.tree) == 1
        if draftless:
            verdict = self._step()
        else:
            verdict = self.verifier.verify(pruned.tree, self.config.temperature, self.rng)
        t2 = self.clock()
        if self.mid is not None:
            self.mid.end_round([int(pruned.source[a]) for a in verdict.accepted])
        emitted = self._commit([pruned.tree.tokens[a] for a in verdict.accepted] + [verdict.bonus], verdict)
        times["verify"] = t2 - t1
        times["tree"] = t1 - t0 + self.clock() - t2
        return RoundStats(
            min(len(verdict.accepted), emitted),  # drafted tokens come first in `new`
            emitted,
            tree.n_alive - 1,
            len(pruned.tree) - 1,
            tuple(steps),
            times,
            lag,
            self.ngram.cache.blocks_read - blocks,
            DRAFTLESS if draftless else TREE,
        )

    def off_round(self) -> RoundStats:
        """Speculation switched off for this round: one autoregressive step, no drafting. The
        n-gram index and its score rows still take the new token, so drafting resumes where AR is."""
        times = zero_times()
        lag = self.builder.mid_lag(self.committed)
        t0 = self.clock()
        verdict = self._step()
        t1 = self.clock()
        if self.mid is not None:
            self.mid.end_round([])  # no call this round: keeps its cache as it is
        emitted = self._commit([verdict.bonus], verdict)
        times["verify"] = t1 - t0
        times["tree"] = self.clock() - t1
        return RoundStats(0, emitted, 0, 0, (), times, lag, 0, OFF)

    def _step(self) -> Verdict:
        """The target's autoregressive step over the root (a verifier without one: a bare root)."""
        root = self.committed[-1]
        if isinstance(self.verifier, SteppingVerifier):
            return self.verifier.step(root, self.config.temperature, self.rng)
        return self.verifier.verify(DraftTree(root), self.config.temperature, self.rng)

    def _commit(self, new: list[int], verdict: Verdict) -> int:
        """Emit the round's tokens; unless done, update the n-gram index, its rows and the context."""
        emitted = self.out.emit(new)
        if not self.out.done:
            self.ngram.cache.set_rows(verdict.top.start, verdict.top.tokens, verdict.top.logps)
            self.ngram.commit(new)
            self.committed.extend(new)
        return emitted


def autoregressive(pair: ModelPair, prompt: list[int], config: DecodeConfig) -> GenerationResult:
    """One target forward per token on a KV cache: the baseline every speedup is measured against.

    Only the last position's logits are computed (logits_to_keep=1), and sampling stays on the
    device: one token id per step comes to the host.
    """
    return drain(_autoregressive_steps(pair, prompt, config))


def _autoregressive_steps(pair: ModelPair, prompt: list[int], config: DecodeConfig) -> Steps:
    """`autoregressive` as steps: yields after the prefill and after every token's forward.

    Not itself in inference mode (on a generator torch would enter it at every resume, once per
    token): forward_block and decode_one run in it, and nothing here writes to their tensors.
    """
    model = pair.target
    clock = make_clock(model.device)
    rng = np.random.default_rng(config.seed)
    t_start = clock()
    cache = DynamicCache()
    logits = forward_block(model, cache, causal_block(prompt, 0, 0), logits_to_keep=1)[-1, : pair.vocab_size]
    prefill_s = clock() - t_start
    yield
    out = Output(config.max_new_tokens, pair.eos_token_ids)
    while True:
        token = next_token(logits, config.temperature, rng)
        out.emit([token])
        if out.done:
            break
        logits = decode_one(model, cache, token, pair.vocab_size)
        yield
    return GenerationResult(out.tokens, [], prefill_s, clock() - t_start, out.hit_eos)


def encode_prompt(tokenizer: object, text: str, raw: bool = False) -> list[int]:
    """Token ids of a user prompt: through the tokenizer's chat template unless raw or it has none.

    The template is rendered to text and tokenized without adding special tokens (the template
    writes its own), which does not depend on what apply_chat_template(tokenize=True) returns in a
    given transformers version (a BatchEncoding in 5.x).
    """
    if not raw and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        if not isinstance(rendered, str):
            raise TypeError(f"chat template rendered {type(rendered).__name__}, expected text")
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    return [int(t) for t in ids]
