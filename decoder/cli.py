"""The command line: decode one prompt on local checkpoints, print the text and a side-by-side table.

`python -m decoder --target PATH [--mid PATH] --prompt TEXT --policy 10101 [--budget B] [--width W]
[--topk M] [--ngram-min-n N] [--linear onednn]`. The tree flags are TreeConfig's fields
(decoder/core/config.py), so the shape the `budget` stage chooses for a pair (its B*, width x topk and
the n-gram drafter's shortest match) decodes from here as it does in the pipeline.

`--policy ddtree` decodes with GRAFT's DDTree from a block proposer: a trained block drafter
(`--block-drafter DIR`, the zoo stage writes them; decoder/graft/drafter.py) or, without one, the
mid drafter as a stand-in; `--edge-scorer DIR` ranks the tree with a TDES edge scorer (the
fit_edges stage writes them; decoder/graft/edge_scorer.py).

`python -m decoder --deployment DIR [--pair NAME] [--expect-sha256 HEX] [--switch-off] --prompt TEXT`
decodes with a pair's deployment bundle (decoder/deploy/deployment.py): its models, dtype and kernel (flags
override them), the prompt in the pair's template, its tree shape, and its policy (the learned
scheduler at the pair check's threshold, or the fallback) beside AR, All-Small and All-Mid. The
table's ``deployed`` row is that policy (with --switch-off, wrapped in decoder.deploy.switch_off.SwitchOff,
priced with the bundle's latency profile); per request, ``gain`` is the net wall-clock gain over AR
(prefill included), ``A`` the accepted drafted tokens per round, ``mid/step`` the share of drafting
steps that called the mid drafter. Freed memory
stays in the process, as in the pipeline's decoding stages (decoder/models/memory.py), unless
--release-freed-memory. The text printed is the target's own output (greedy: token-identical to
autoregressive decoding, checked in the table's `lossless` column).

Exit status 2 with one `error: ...` line on stderr for bad input (flags, paths, prompts that do not
fit, models that cannot be used); argparse reports malformed flags the same way. This module is an
entry point, apart from the library (decoder/core/decode.py, decoder/measure.py), so
neither imports it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

from decoder.core.adaptive import parse_adaptive
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.decode import check_prompt, encode_prompt
from decoder.core.policies import AR, DDTREE, is_adaptive, parse_policy, uses_mid
from decoder.deploy.deployment import Deployment, load_deployment
from decoder.deploy.switch_off import for_deployment
from decoder.generate import check_block_prompt, generate
from decoder.graft.drafter import load_block_drafter
from decoder.graft.edge_scorer import load_edge_scorer
from decoder.measure import Method, format_table, policy_name, run_side_by_side, summarise_results
from decoder.models.memory import keep_freed_memory
from decoder.models.pair import LINEAR_KERNELS, ModelPair, load_pair
from decoder.models.templates import render_prompt

DEFAULT_TREE = TreeConfig()
TREE_FLAGS = ("budget", "width", "topk", "ngram_min_n")
MODEL_DEFAULTS = {"dtype": "float32", "device": "cpu", "linear": "stock"}
DEPLOYED = "deployed"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m decoder", description=__doc__.split("\n")[0])
    p.add_argument("--target", help="local folder of the target checkpoint (else the bundle's)")
    p.add_argument("--mid", help="local folder of the mid drafter (same tokenizer as the target)")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument(
        "--policy",
        help="ar | all-small (default) | all-mid | a bit string like 10101 | adaptive[:MARGIN:PROBE] "
        "(the online adaptive rule, decoder/core/adaptive.py) | ddtree",
    )
    graft = p.add_argument_group("GRAFT (--policy ddtree)")
    graft.add_argument("--block-drafter", help="folder of a trained block drafter for the target")
    graft.add_argument("--edge-scorer", help="folder of a TDES edge scorer for that block drafter")
    dep = p.add_argument_group("deployment bundle (the pipeline's deploy stage: artifacts/deploy)")
    dep.add_argument("--deployment", help="bundle folder (with index.json) or one pair's folder")
    dep.add_argument("--pair", help="the pair to deploy (optional when the bundle holds one)")
    dep.add_argument("--expect-sha256", help="refuse the bundle unless its checksums.json has this sha256")
    dep.add_argument(
        "--switch-off",
        action="store_true",
        help="per request, turn speculation off while it prices below AR (decoder/deploy/switch_off.py), "
        "rounds priced with the bundle's latency profile",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    tree = p.add_argument_group("tree shape (defaults: the paper's; the budget stage's choice for a pair)")
    tree.add_argument(
        "--budget",
        type=int,
        help=f"verified tree nodes besides the root (default {DEFAULT_TREE.budget}; the budget stage's B* "
        "for a pair; small on CPUs)",
    )
    tree.add_argument("--width", type=int, help=f"frontier nodes per step (default {DEFAULT_TREE.width})")
    tree.add_argument("--topk", type=int, help=f"children per expanded node (default {DEFAULT_TREE.topk})")
    tree.add_argument(
        "--ngram-min-n",
        type=int,
        help=f"shortest suffix match the n-gram drafter drafts from (1..{DEFAULT_TREE.ngram_max_n}, "
        f"default {DEFAULT_TREE.ngram_min_n})",
    )
    p.add_argument("--dtype", help="default float32 (a bundle: its own)")
    p.add_argument("--device", help="default cpu (a bundle: its own)")
    p.add_argument(
        "--linear",
        choices=LINEAR_KERNELS,
        help="nn.Linear kernel, default stock (a bundle: its own): onednn (CPU) runs oneDNN on "
        "each weight, held once; on a 2-core CPU it halves an fp32 step",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="do not apply the chat template (the tokenizer's; a bundle's pair's)",
    )
    p.add_argument(
        "--release-freed-memory",
        action="store_true",
        help="leave glibc's malloc as it is: freed memory goes back to the kernel and a round's tensors "
        "fault their pages in again (slower on a CPU; decoder/models/memory.py)",
    )
    p.add_argument("--no-compare", action="store_true", help="skip the side-by-side autoregressive run")
    return p.parse_args(argv)


def tree_of(args: argparse.Namespace) -> TreeConfig:
    """The flags' tree (the paper's defaults where not given), each refused by its flag's name
    before any model is loaded."""
    shape = {
        f: getattr(args, f) if getattr(args, f) is not None else getattr(DEFAULT_TREE, f) for f in TREE_FLAGS
    }
    for flag in ("budget", "width", "topk"):
        if shape[flag] < 1:
            raise ValueError(f"--{flag} must be a positive number of tree nodes, got {shape[flag]}")
    if not 1 <= shape["ngram_min_n"] <= DEFAULT_TREE.ngram_max_n:
        raise ValueError(
            f"--ngram-min-n must be in 1..{DEFAULT_TREE.ngram_max_n}, got {shape['ngram_min_n']}"
        )
    return TreeConfig(**shape)


def model_flag(args: argparse.Namespace, name: str, bundle: Deployment | None = None) -> str:
    """--dtype, --device or --linear as given, else the bundle's, else the default."""
    given = getattr(args, name)
    if given is not None:
        return given
    return getattr(bundle.models, name) if bundle is not None else MODEL_DEFAULTS[name]


def _policy_run(args: argparse.Namespace) -> tuple[ModelPair, list[int], list[Method], DecodeConfig, list]:
    """What the flags decode: one policy (``--policy``) on the flags' models and tree."""
    if args.switch_off:
        raise ValueError("--switch-off prices rounds with a bundle's latency profile: pass --deployment DIR")
    if args.target is None:
        raise ValueError("pass --target PATH (and --mid PATH), or --deployment DIR")
    policy = args.policy or "all-small"
    config = DecodeConfig(args.max_new_tokens, args.temperature, args.seed, tree_of(args))
    parsed = parse_policy(policy, config.tree.depth)
    if is_adaptive(parsed):
        parse_adaptive(policy)  # a malformed MARGIN or PROBE is refused before any model loads
    if uses_mid(parsed) and args.mid is None:
        raise ValueError(f"policy {policy!r} calls the mid drafter: pass --mid PATH")
    graft_flags = [f"--{f.replace('_', '-')}" for f in ("block_drafter", "edge_scorer") if getattr(args, f)]
    if graft_flags and parsed != DDTREE:
        raise ValueError(f"{', '.join(graft_flags)} serve --policy ddtree only, not {policy!r}")
    if parsed == DDTREE and args.mid is None and args.block_drafter is None:
        raise ValueError(
            "policy 'ddtree' drafts with a block proposer: pass --block-drafter DIR or --mid PATH"
        )
    mid = args.mid if parsed != AR else None
    flags = {n: model_flag(args, n) for n in MODEL_DEFAULTS}
    pair = load_pair(args.target, mid, flags["dtype"], flags["device"], flags["linear"])
    ids = encode_prompt(pair.tokenizer, args.prompt, raw=args.raw)
    method = Method(policy_name(policy), policy)
    if parsed == DDTREE:
        method = ddtree_method(args, pair, config)
        stand_in = method.proposer is None  # generate's: a causal-LM proposer over the mid drafter
        k = config.block.k if stand_in else method.proposer.k
        check_block_prompt(pair, ids, config, k, pair.mid if stand_in else None)
    else:
        check_prompt(pair, ids, config, parsed)
    return pair, ids, [method], config, [None]


def ddtree_method(args: argparse.Namespace, pair: ModelPair, config: DecodeConfig) -> Method:
    """'ddtree' with the flags' block drafter (else generate's stand-in over the mid drafter) and
    edge scorer, each loaded and checked against the target."""
    proposer = load_block_drafter(args.block_drafter, pair.target) if args.block_drafter else None
    scorer = None
    if args.edge_scorer:
        k = proposer.k if proposer is not None else config.block.k
        scorer, _ = load_edge_scorer(args.edge_scorer, pair.vocab_size, k)
    return Method(DDTREE, DDTREE, proposer=proposer, edge_scorer=scorer)


def _deployment_run(
    args: argparse.Namespace,
) -> tuple[ModelPair, list[int], list[Method], DecodeConfig, list]:
    """What a bundle decodes: its policy as ``deployed``, beside the endpoints, on its models and
    tree, the prompt in its template (unless --raw), with its runtime context."""
    given = [f"--{f.replace('_', '-')}" for f in (*TREE_FLAGS, "policy") if getattr(args, f) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: the bundle chooses the policy and tree shape; drop them")
    bundle = load_deployment(args.deployment, args.pair, args.expect_sha256)
    config = replace(
        bundle.config, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    target = args.target or bundle.models.target
    mid = args.mid or bundle.models.mid
    flags = {n: model_flag(args, n, bundle) for n in MODEL_DEFAULTS}
    pair = load_pair(target, mid, flags["dtype"], flags["device"], flags["linear"])
    tok = pair.tokenizer
    if args.raw:
        ids = encode_prompt(tok, args.prompt, raw=True)
    else:
        ids = [
            int(t)
            for t in tok.encode(
                render_prompt(bundle.models.template, [args.prompt], tok), add_special_tokens=False
            )
        ]
    check_prompt(pair, ids, config, bundle.policy)
    endpoints = ["all-small", "all-mid"] if mid is not None else ["all-small"]
    deployed = for_deployment(bundle) if args.switch_off else bundle.policy
    methods = [*(Method(m, m) for m in endpoints), Method(DEPLOYED, deployed)]
    print(
        f"pair {bundle.pair_id}: deploys {bundle.decision['deploys']} "
        f"(checksums sha256 {bundle.checksums_sha256})",
        file=sys.stderr,
    )
    return pair, ids, methods, config, [bundle.runtime(len(ids))]


def main(argv: list[str] | None = None) -> int:
    """Decode one prompt, print the text and a stats table against autoregressive decoding."""
    args = parse_args(argv)
    if not args.release_freed_memory:
        keep_freed_memory()
    try:
        if not math.isfinite(args.temperature):
            raise ValueError(f"--temperature must be a finite number, got {args.temperature}")
        run = _deployment_run if args.deployment is not None else _policy_run
        pair, ids, methods, config, runtime = run(args)
        tok = pair.tokenizer
        if args.no_compare:
            last = methods[-1]
            res = generate(pair, ids, last.policy, config, runtime[0], False, last.proposer, last.edge_scorer)
            print(tok.decode(res.new_tokens))
            print(
                f"{len(res.new_tokens)} tokens in {res.wall_s:.3f} s = {res.tokens_per_s:.1f} tok/s, "
                f"A = {res.mean_accepted_length:.2f}"
            )
            return 0
        results = run_side_by_side(pair, [ids], methods, config, runtime, timing=False)
        rows = summarise_results(results, config.temperature)
        res = results[methods[-1].name][0]
    except (ValueError, OSError, TypeError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(tok.decode(res.new_tokens))
    print()
    print(format_table(rows, gain=True))
    return 0
