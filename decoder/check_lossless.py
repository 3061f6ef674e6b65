"""Is a speculative output the target's own greedy output? Exact in fp32; near-ties explained in bf16.

Contract: `compare` takes the target's autoregressive greedy output (the reference, decoded in the
run's dtype) and a speculative output of the same prompt. Identical outputs pass. Otherwise every
divergence is classified from the target recomputed in fp32 (one teacher-forced forward over the
prompt and the speculative text):
- the first divergence, at position i: the reference says r, the speculative output says s;
- every later position j where the speculative token is not the fp32 target's argmax given the
  speculative text so far (after i the two texts have different contexts, so the judge is the
  target itself).
A divergence is a **near-tie** when both tokens' fp32 logits lie within `tolerance` of the
position's top fp32 logit (so the top-2 gap is below it): tree forwards and one-token forwards
round differently in the last bits of bf16/fp16, which may flip such an argmax. Otherwise it is a
**real mismatch**. The tolerance is relative to the logit scale:
    tol = RELATIVE_TOLERANCE[dtype] * max(1, |top fp32 logit|)
with 0 for float32 (fp32 is strict: every divergence is a real mismatch), 2^-5 (four bf16 ulps)
for bfloat16 and 2^-8 for float16.

CLI: `python -m decoder.check_lossless --target PATH [--mid PATH] --dtype bfloat16 --prompt TEXT
[--prompt TEXT ...] [--policy all-small --policy 10101 ...]`; exit status 1 on any real mismatch.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from decoder.core.config import DecodeConfig
from decoder.core.decode import check_prompt, encode_prompt
from decoder.core.policies import AR, parse_policy, uses_mid
from decoder.core.tensors import causal_block, forward_block
from decoder.generate import generate
from decoder.models.pair import load_causal_lm, load_pair

RELATIVE_TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8}


def tolerance_for(dtype: torch.dtype, top_logit: float) -> float:
    """Absolute near-tie tolerance for one position (see the module docstring)."""
    if dtype not in RELATIVE_TOLERANCE:
        raise ValueError(f"no near-tie tolerance for {dtype}; known: {sorted(map(str, RELATIVE_TOLERANCE))}")
    return RELATIVE_TOLERANCE[dtype] * max(1.0, abs(top_logit))


@dataclass(frozen=True)
class Divergence:
    """One position where the speculative token is not the target's greedy choice."""

    position: int  # index into the new tokens
    expected: int  # the reference's token (first divergence) or the fp32 target's argmax (later)
    got: int  # the speculative output's token
    gap: float  # fp32 logit of the position's top token minus the lower of the two tokens' logits
    tolerance: float
    near_tie: bool


@dataclass(frozen=True)
class SequenceCheck:
    """One prompt: reference vs speculative output."""

    n_reference: int
    n_output: int
    agreed_prefix: int  # tokens equal from the start
    divergences: tuple[Divergence, ...] = ()

    @property
    def identical(self) -> bool:
        return self.agreed_prefix == self.n_reference == self.n_output

    @property
    def real_mismatches(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if not d.near_tie)


@dataclass(frozen=True)
class LosslessReport:
    """Many prompts of one method."""

    dtype: str
    checks: list[SequenceCheck] = field(default_factory=list)

    @property
    def sequence_agreement(self) -> float:
        """Share of outputs identical to the reference."""
        return sum(c.identical for c in self.checks) / len(self.checks) if self.checks else 1.0

    @property
    def tokens_compared(self) -> int:
        """token_agreement's denominator: per prompt, the longer of reference and output."""
        return sum(max(c.n_reference, c.n_output) for c in self.checks)

    @property
    def token_agreement(self) -> float:
        """Share of reference tokens reproduced before the first divergence."""
        total = self.tokens_compared
        return sum(c.agreed_prefix for c in self.checks) / total if total else 1.0

    @property
    def n_near_ties(self) -> int:
        return sum(d.near_tie for c in self.checks for d in c.divergences)

    @property
    def n_real_mismatches(self) -> int:
        return sum(len(c.real_mismatches) for c in self.checks)

    @property
    def ok(self) -> bool:
        return self.n_real_mismatches == 0

    def summary(self) -> dict[str, float | int | str]:
        return {
            "dtype": self.dtype,
            "prompts": len(self.checks),
            "sequence_agreement": self.sequence_agreement,
            "token_agreement": self.token_agreement,
            "tokens_compared": self.tokens_compared,
            "near_ties": self.n_near_ties,
            "real_mismatches": self.n_real_mismatches,
        }


def fp32_judge(model: torch.nn.Module) -> torch.nn.Module:
    """The target in fp32 (the model itself when it already is)."""
    if model.dtype == torch.float32:
        return model
    return copy.deepcopy(model).float().eval()


@torch.inference_mode()
def compare(
    judge: torch.nn.Module,
    prompt: Sequence[int],
    reference: Sequence[int],
    output: Sequence[int],
    dtype: torch.dtype,
) -> SequenceCheck:
    """Classify every divergence of `output` from `reference` (see the module docstring).

    judge: the target in fp32 (only run when the outputs differ); dtype: the dtype both outputs
    were decoded in (sets the tolerance).
    """
    prompt, reference, output = (
        [int(t) for t in prompt],
        [int(t) for t in reference],
        [int(t) for t in output],
    )
    if not prompt:
        raise ValueError("prompt is empty")
    n = min(len(reference), len(output))
    i = next((j for j in range(n) if reference[j] != output[j]), n)
    check = SequenceCheck(len(reference), len(output), i)
    if i == len(reference) == len(output):
        return check
    if i == n:
        # one output is a strict prefix of the other: under the same stopping rules that cannot come
        # from rounding, so it is a real mismatch (-1 stands for "stopped")
        long = reference if len(reference) > n else output
        expected, got = (long[n], -1) if long is reference else (-1, long[n])
        return SequenceCheck(
            len(reference), len(output), i, (Divergence(n, expected, got, math.inf, 0.0, False),)
        )
    if judge.dtype != torch.float32:
        raise ValueError(f"the judge must be the target in float32, got {judge.dtype}")
    # fp32 logits predicting output[i:], teacher-forced on the speculative text
    text = prompt + output
    rows = len(output) - i
    logits = forward_block(judge, DynamicCache(), causal_block(text[:-1], 0, 0), logits_to_keep=rows)
    top_vals, top_ids = logits.max(dim=-1)
    got = torch.tensor(output[i:], device=logits.device)
    got_vals = logits.gather(1, got[:, None])[:, 0]
    tops, argmax, got_l = top_vals.tolist(), top_ids.tolist(), got_vals.tolist()
    ref_l = float(logits[0, reference[i]])
    divergences = []
    for k, j in enumerate(range(i, len(output))):
        tol = tolerance_for(dtype, tops[k])
        if k == 0:
            gap = tops[0] - min(ref_l, got_l[0])
            expected = reference[i]
        elif output[j] != argmax[k]:
            gap = tops[k] - got_l[k]
            expected = argmax[k]
        else:
            continue
        divergences.append(Divergence(j, expected, output[j], gap, tol, bool(gap <= tol and tol > 0)))
    return SequenceCheck(len(reference), len(output), i, tuple(divergences))


def check_outputs(
    judge: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    dtype: torch.dtype,
) -> LosslessReport:
    """`compare` for every prompt of one method."""
    if not len(prompts) == len(references) == len(outputs):
        raise ValueError(f"{len(prompts)} prompts, {len(references)} references, {len(outputs)} outputs")
    checks = [compare(judge, p, r, o, dtype) for p, r, o in zip(prompts, references, outputs, strict=True)]
    return LosslessReport(str(dtype).removeprefix("torch."), checks)


def format_report(name: str, report: LosslessReport) -> str:
    s = report.summary()
    return (
        f"{name:<12} {s['prompts']:>3} prompts  identical {s['sequence_agreement']:6.1%}  "
        f"tokens {s['token_agreement']:6.1%}  near-ties {s['near_ties']:>3}  "
        f"real mismatches {s['real_mismatches']:>3}"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m decoder.check_lossless", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="local folder of the target checkpoint")
    p.add_argument("--mid", help="local folder of the mid drafter")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for more)")
    p.add_argument(
        "--policy",
        action="append",
        help="policy to check (default all-small; with --mid also all-mid and 10101)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--raw", action="store_true", help="do not apply the tokenizer's chat template")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Decode each prompt with AR and each policy in --dtype, classify divergences, print a table."""
    args = _parse_args(argv)
    try:
        config = DecodeConfig(max_new_tokens=args.max_new_tokens)
        policies = args.policy or (["all-small", "all-mid", "10101"] if args.mid else ["all-small"])
        parsed = [parse_policy(p, config.tree.depth) for p in policies]
        if AR in parsed:
            raise ValueError("'ar' is the reference, not a policy to check")
        if any(uses_mid(p) for p in parsed) and args.mid is None:
            raise ValueError("a policy calls the mid drafter: pass --mid PATH")
        pair = load_pair(args.target, args.mid, args.dtype, args.device)
        judge = pair.target if args.dtype == "float32" else load_causal_lm(args.target, device=args.device)
        prompts = [encode_prompt(pair.tokenizer, text, raw=args.raw) for text in args.prompt]
        for ids in prompts:
            check_prompt(pair, ids, config)
    except (ValueError, OSError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    refs = [generate(pair, ids, AR, config).new_tokens for ids in prompts]
    worst = 0
    print(f"reference: the target's own AR greedy output in {args.dtype}; judge: the target in float32")
    for name in policies:
        outs = [generate(pair, ids, name, config, timing=False).new_tokens for ids in prompts]
        report = check_outputs(judge, prompts, refs, outs, pair.target.dtype)
        print(format_report(name, report))
        for c in report.checks:
            for d in c.divergences:
                kind = "near-tie" if d.near_tie else "REAL MISMATCH"
                print(
                    f"    token {d.position}: expected {d.expected}, got {d.got}, fp32 gap {d.gap:.4g} "
                    f"(tolerance {d.tolerance:.4g}): {kind}"
                )
        worst = max(worst, report.n_real_mismatches)
    return 1 if worst else 0


if __name__ == "__main__":
    raise SystemExit(main())
