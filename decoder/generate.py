"""Speculative generation with a shared draft tree, and the autoregressive baseline.

Contract: `generate` returns exactly the tokens the target would produce on its own (greedy:
token-identical to `model.generate(do_sample=False)`; sampling: the same distribution). Output
stops right after the first EOS or at max_new_tokens, never later. Every method is timed with the
same clock; per round we record accepted length, tree sizes, mid calls and component times.

CLI: `python -m decoder.generate --target PATH [--mid PATH] --prompt TEXT --policy 10101`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from decoder.config import DecodeConfig
from decoder.construct import RoundBuilder, StepRecord
from decoder.mid import MidDrafter
from decoder.models import ModelPair
from decoder.ngram import NgramDrafter
from decoder.policies import AR, RuntimeContext, Scheduler, StepContext, parse_policy, uses_mid
from decoder.tensors import causal_block, forward_block
from decoder.timing import make_clock, zero_times
from decoder.verify import TargetVerifier


@dataclass(frozen=True)
class RoundStats:
    """One draft-and-verify round."""

    accepted: int  # drafted tokens the target accepted (the bonus token not counted)
    emitted: int  # tokens added to the output this round (after EOS / budget truncation)
    tree_size: int  # live drafted nodes before the prune
    verified_size: int  # drafted nodes sent to the target
    steps: tuple[StepRecord, ...]
    times: dict[str, float]  # seconds per component

    @property
    def mid_calls(self) -> tuple[bool, ...]:
        return tuple(s.used_mid for s in self.steps)


@dataclass(frozen=True)
class GenerationResult:
    new_tokens: list[int]
    rounds: list[RoundStats]
    prefill_s: float
    wall_s: float  # prefill + decoding
    stopped_at_eos: bool

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_tokens) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return float(np.mean([r.accepted for r in self.rounds])) if self.rounds else 0.0

    def component_times(self) -> dict[str, float]:
        total = zero_times()
        for r in self.rounds:
            for k, v in r.times.items():
                total[k] += v
        return total


def check_prompt(pair: ModelPair, prompt_ids: list[int], config: DecodeConfig) -> None:
    """Reject bad input before any model work."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt is empty: at least one token is needed")
    bad = [t for t in prompt_ids if not 0 <= int(t) < pair.vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside [0, {pair.vocab_size}): {bad[:5]}")
    need = len(prompt_ids) + config.max_new_tokens
    if need > pair.context_len:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({config.max_new_tokens}) = {need} "
            f"exceeds the target's context of {pair.context_len} tokens"
        )


class _Output:
    """Collects emitted tokens and applies the exact stopping rules."""

    def __init__(self, limit: int, eos: tuple[int, ...]) -> None:
        self.tokens: list[int] = []
        self.limit = limit
        self.eos = set(eos)
        self.done = False
        self.hit_eos = False

    def emit(self, tokens: list[int]) -> int:
        n = 0
        for t in tokens:
            if self.done:
                break
            self.tokens.append(int(t))
            n += 1
            if t in self.eos:
                self.done = self.hit_eos = True
            elif len(self.tokens) >= self.limit:
                self.done = True
        return n


def generate(
    pair: ModelPair,
    prompt_ids: list[int],
    policy: str | Callable[[StepContext], bool],
    config: DecodeConfig | None = None,
    runtime: RuntimeContext | None = None,
) -> GenerationResult:
    """Decode with the given policy ('ar', 'all-small', 'all-mid', '10101' or a scheduler)."""
    config = config or DecodeConfig()
    parsed = parse_policy(policy, config.tree.depth)
    prompt = [int(t) for t in prompt_ids]
    check_prompt(pair, prompt, config)
    if parsed == AR:
        return autoregressive(pair, prompt, config)
    if uses_mid(parsed) and pair.mid is None:
        raise ValueError(f"policy {policy!r} calls the mid drafter but the pair has none")
    return _speculative(pair, prompt, parsed, config, runtime)


def _speculative(
    pair: ModelPair,
    prompt: list[int],
    scheduler: Scheduler,
    config: DecodeConfig,
    runtime: RuntimeContext | None,
) -> GenerationResult:
    cfg = config.tree
    clock = make_clock(pair.target.device)
    rng = np.random.default_rng(config.seed)
    t_start = clock()
    verifier = TargetVerifier(pair.target, pair.vocab_size, cfg.topk)
    ngram = NgramDrafter(cfg.ngram_max_n, cfg.ngram_max_matches, cfg.ngram_chain_len)
    mid = MidDrafter(pair.mid, pair.vocab_size) if pair.mid is not None and uses_mid(scheduler) else None
    builder = RoundBuilder(cfg, ngram, mid, clock)
    top = verifier.prefill(prompt)
    ngram.commit(prompt)
    ngram.cache.set_rows(top.start, top.tokens, top.logps)
    committed = list(prompt)
    out = _Output(config.max_new_tokens, pair.eos_token_ids)
    prefill_s = clock() - t_start
    rounds: list[RoundStats] = []
    while not out.done:
        times = zero_times()
        tree, steps = builder.build(committed, scheduler, times, runtime)
        t0 = clock()
        pruned = tree.prune(cfg.budget)
        t1 = clock()
        verdict = verifier.verify(pruned.tree, config.temperature, rng)
        t2 = clock()
        if mid is not None:
            mid.end_round([int(pruned.source[a]) for a in verdict.accepted])
        new = [pruned.tree.tokens[a] for a in verdict.accepted] + [verdict.bonus]
        emitted = out.emit(new)
        if not out.done:
            ngram.cache.set_rows(verdict.top.start, verdict.top.tokens, verdict.top.logps)
            ngram.commit(new)
            committed.extend(new)
        times["verify"] = t2 - t1
        times["tree"] = t1 - t0 + clock() - t2
        rounds.append(
            RoundStats(
                len(verdict.accepted),
                emitted,
                tree.n_alive - 1,
                len(pruned.tree) - 1,
                tuple(steps),
                times,
            )
        )
    return GenerationResult(out.tokens, rounds, prefill_s, clock() - t_start, out.hit_eos)


@torch.inference_mode()
def autoregressive(pair: ModelPair, prompt: list[int], config: DecodeConfig) -> GenerationResult:
    """One target forward per token on a KV cache: the baseline every speedup is measured against."""
    model = pair.target
    clock = make_clock(model.device)
    rng = np.random.default_rng(config.seed)
    t_start = clock()
    cache = DynamicCache()
    logits = forward_block(model, cache, causal_block(prompt, 0, 0))[-1, : pair.vocab_size]
    prefill_s = clock() - t_start
    out = _Output(config.max_new_tokens, pair.eos_token_ids)
    pos = len(prompt)
    while True:
        if config.temperature == 0:
            token = int(logits.argmax())
        else:
            probs = torch.softmax(logits / config.temperature, dim=-1).double().cpu().numpy()
            token = int(rng.choice(len(probs), p=probs / probs.sum()))
        out.emit([token])
        if out.done:
            break
        logits = forward_block(model, cache, causal_block([token], pos, pos))[-1, : pair.vocab_size]
        pos += 1
    return GenerationResult(out.tokens, [], prefill_s, clock() - t_start, out.hit_eos)


def _parse_args(argv: list[str] | None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m decoder.generate", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="local folder of the target checkpoint")
    p.add_argument("--mid", help="local folder of the mid drafter (same tokenizer as the target)")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--policy", default="all-small", help="ar | all-small | all-mid | a bit string like 10101")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--raw", action="store_true", help="do not apply the tokenizer's chat template")
    p.add_argument("--no-compare", action="store_true", help="skip the side-by-side autoregressive run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Decode one prompt, print the text and a stats table against autoregressive decoding."""
    from decoder.measure import format_table, measure_policies
    from decoder.models import load_pair

    args = _parse_args(argv)
    try:
        pair = load_pair(args.target, args.mid, args.dtype, args.device)
        tok = pair.tokenizer
        if not args.raw and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        else:
            ids = tok(args.prompt)["input_ids"]
        config = DecodeConfig(args.max_new_tokens, args.temperature, args.seed)
        parse_policy(args.policy, config.tree.depth)
        check_prompt(pair, ids, config)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"error: {err}")
        return 2
    if args.no_compare:
        res = generate(pair, ids, args.policy, config)
        print(tok.decode(res.new_tokens))
        print(
            f"{len(res.new_tokens)} tokens in {res.wall_s:.3f} s = {res.tokens_per_s:.1f} tok/s, "
            f"A = {res.mean_accepted_length:.2f}"
        )
        return 0
    rows = measure_policies(pair, [ids], [AR, args.policy], config)
    res = generate(pair, ids, args.policy, config)
    print(tok.decode(res.new_tokens))
    print()
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
