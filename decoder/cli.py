"""The command line: decode one prompt on local checkpoints, print the text and a side-by-side table.

`python -m decoder --target PATH [--mid PATH] --prompt TEXT --policy 10101 [--budget B] [--width W]
[--topk M] [--ngram-min-n N] [--linear onednn]`. The tree flags are TreeConfig's fields
(decoder/config.py), so the shape the `budget` stage chooses for a pair (its B*, width x topk and
the n-gram drafter's shortest match) decodes from here as it does in the pipeline. Freed memory
stays in the process, as in the pipeline's decoding stages (decoder/memory.py), unless
--release-freed-memory. The text printed is the target's own output (greedy: token-identical to
autoregressive decoding, checked in the table's `lossless` column).

Exit status 2 with one `error: ...` line on stderr for bad input (flags, paths, prompts that do not
fit, models that cannot be used); argparse reports malformed flags the same way. This module is an
entry point, apart from the library (decoder/generate.py, decoder/measure.py), so neither imports it.
"""

from __future__ import annotations

import argparse
import math
import sys

from decoder.config import DecodeConfig, TreeConfig
from decoder.generate import check_prompt, encode_prompt, generate
from decoder.measure import Method, format_table, policy_name, run_side_by_side, summarise_results
from decoder.memory import keep_freed_memory
from decoder.models import LINEAR_KERNELS, load_pair
from decoder.policies import AR, parse_policy, uses_mid

DEFAULT_TREE = TreeConfig()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m decoder", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="local folder of the target checkpoint")
    p.add_argument("--mid", help="local folder of the mid drafter (same tokenizer as the target)")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument(
        "--policy", default="all-small", help="ar | ddtree | all-small | all-mid | a bit string like 10101"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    tree = p.add_argument_group("tree shape (defaults: the paper's; the budget stage's choice for a pair)")
    tree.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_TREE.budget,
        help="verified tree nodes besides the root (the budget stage's B* for a pair; small on CPUs)",
    )
    tree.add_argument("--width", type=int, default=DEFAULT_TREE.width, help="frontier nodes per step")
    tree.add_argument("--topk", type=int, default=DEFAULT_TREE.topk, help="children per expanded node")
    tree.add_argument(
        "--ngram-min-n",
        type=int,
        default=DEFAULT_TREE.ngram_min_n,
        help=f"shortest suffix match the n-gram drafter drafts from (1..{DEFAULT_TREE.ngram_max_n})",
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--linear",
        choices=LINEAR_KERNELS,
        default="stock",
        help="nn.Linear kernel: onednn (CPU) prepacks the weights; on a 2-core CPU it halves an fp32 step",
    )
    p.add_argument("--raw", action="store_true", help="do not apply the tokenizer's chat template")
    p.add_argument(
        "--release-freed-memory",
        action="store_true",
        help="leave glibc's malloc as it is: freed memory goes back to the kernel and a round's tensors "
        "fault their pages in again (slower on a CPU; decoder/memory.py)",
    )
    p.add_argument("--no-compare", action="store_true", help="skip the side-by-side autoregressive run")
    return p.parse_args(argv)


def tree_of(args: argparse.Namespace) -> TreeConfig:
    """The flags' tree, each refused by its flag's name before any model is loaded."""
    for flag in ("budget", "width", "topk"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be a positive number of tree nodes, got {getattr(args, flag)}")
    if not 1 <= args.ngram_min_n <= DEFAULT_TREE.ngram_max_n:
        raise ValueError(f"--ngram-min-n must be in 1..{DEFAULT_TREE.ngram_max_n}, got {args.ngram_min_n}")
    return TreeConfig(budget=args.budget, width=args.width, topk=args.topk, ngram_min_n=args.ngram_min_n)


def main(argv: list[str] | None = None) -> int:
    """Decode one prompt, print the text and a stats table against autoregressive decoding."""
    args = parse_args(argv)
    if not args.release_freed_memory:
        keep_freed_memory()
    try:
        if not math.isfinite(args.temperature):
            raise ValueError(f"--temperature must be a finite number, got {args.temperature}")
        config = DecodeConfig(args.max_new_tokens, args.temperature, args.seed, tree_of(args))
        parsed = parse_policy(args.policy, config.tree.depth)
        if uses_mid(parsed) and args.mid is None:
            raise ValueError(f"policy {args.policy!r} calls the mid drafter: pass --mid PATH")
        mid = args.mid if parsed != AR else None
        pair = load_pair(args.target, mid, args.dtype, args.device, args.linear)
        tok = pair.tokenizer
        ids = encode_prompt(tok, args.prompt, raw=args.raw)
        check_prompt(pair, ids, config, parsed)
        if args.no_compare:
            res = generate(pair, ids, args.policy, config, timing=False)
            print(tok.decode(res.new_tokens))
            print(
                f"{len(res.new_tokens)} tokens in {res.wall_s:.3f} s = {res.tokens_per_s:.1f} tok/s, "
                f"A = {res.mean_accepted_length:.2f}"
            )
            return 0
        name = policy_name(args.policy)
        results = run_side_by_side(pair, [ids], [Method(name, args.policy)], config, timing=False)
        rows = summarise_results(results, config.temperature)
        res = results[name][0]
    except (ValueError, OSError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(tok.decode(res.new_tokens))
    print()
    print(format_table(rows))
    return 0
