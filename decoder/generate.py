"""`generate`: one decode of a prompt with any policy, the entry point of the runtime.

Tree policies ('all-small', 'all-mid', a bit string such as '10101', the online adaptive rule
'adaptive' (decoder/core/adaptive.py), a learned scheduler) and the autoregressive baseline ('ar')
run in decoder/core/decode.py; GRAFT's 'ddtree' runs in
decoder/graft/decode.py with a block proposer (a trained block drafter, decoder/graft/drafter.py,
or the pair's mid drafter as a stand-in) and optionally the TDES edge scorer.

Contract: the tokens are exactly the target's own (greedy: token-identical to
`model.generate(do_sample=False)` in fp32; in bf16/fp16 a near-tied argmax may flip, which
decoder/check_lossless.py classifies; sampling: the same distribution), stopping right after the
first EOS or at max_new_tokens. Bad input is refused before any model work.

The command line is decoder/cli.py (`python -m decoder --target PATH [--mid PATH] --prompt TEXT`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from decoder.core.adaptive import adaptive_for, parameter_ratio
from decoder.core.config import DecodeConfig
from decoder.core.decode import (
    Steps,
    _autoregressive_steps,
    _speculative_steps,
    _with_cpu,
    check_prompt,
    drain,
)
from decoder.core.outcome import GenerationResult
from decoder.core.policies import (
    AR,
    DDTREE,
    RuntimeContext,
    StepContext,
    is_adaptive,
    parse_policy,
    start_generation,
    uses_mid,
)
from decoder.graft.block import BlockProposer
from decoder.graft.decode import ddtree_generate
from decoder.graft.edge_scorer import EdgeScorer
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import ModelPair, context_of


def generate(
    pair: ModelPair,
    prompt_ids: list[int],
    policy: str | Callable[[StepContext], bool],
    config: DecodeConfig | None = None,
    runtime: RuntimeContext | None = None,
    timing: bool = True,
    proposer: BlockProposer | None = None,
    edge_scorer: EdgeScorer | None = None,
) -> GenerationResult:
    """Decode with the given policy ('ar', 'ddtree', 'all-small', 'all-mid', '10101' or a scheduler).

    timing=False leaves the per-round component times at 0 and reads the (syncing) clock only for
    prefill and wall time, so an accelerator is not synchronised ~20 times per round. `proposer`
    serves 'ddtree'; without one, a CausalLMProposer over the pair's mid drafter stands in.
    `edge_scorer` (GRAFT's TDES) ranks the 'ddtree' tree by parent-aware edge scores.
    """
    cpu0 = time.process_time()
    steps = generate_steps(pair, prompt_ids, policy, config, runtime, timing, proposer, edge_scorer)
    return _with_cpu(drain(steps), cpu0)


def generate_steps(
    pair: ModelPair,
    prompt_ids: list[int],
    policy: str | Callable[[StepContext], bool],
    config: DecodeConfig | None = None,
    runtime: RuntimeContext | None = None,
    timing: bool = True,
    proposer: BlockProposer | None = None,
    edge_scorer: EdgeScorer | None = None,
) -> Steps:
    """`generate` one piece at a time: a generator that yields after the prefill and after every
    round (every token for AR; a 'ddtree' decode runs whole at the first step) and returns the
    GenerationResult. Nothing runs, not even the prompt checks, before the first ``next``. The
    result's wall_s spans its first step to its last, suspended time included, and its cpu_s is 0:
    decoder.measure.run_lockstep interleaves decodes this way and times each step itself."""
    config = config or DecodeConfig()
    parsed = parse_policy(policy, config.tree.depth)
    start_generation(parsed)  # a scheduler's per-generation state (backoff) starts afresh
    prompt = [int(t) for t in prompt_ids]
    if parsed == DDTREE:
        if proposer is None:
            if pair.mid is None:
                raise ValueError("policy 'ddtree' needs a block proposer or a pair with a mid drafter")
            proposer = CausalLMProposer(pair.mid, pair.vocab_size, config.block.k)
            check_block_prompt(pair, prompt, config, proposer.k, pair.mid)
        else:
            check_block_prompt(pair, prompt, config, proposer.k)
        return ddtree_generate(pair, prompt, proposer, config, timing, edge_scorer)
    if edge_scorer is not None:
        raise ValueError(f"an edge scorer serves the 'ddtree' policy only, not {policy!r}")
    if uses_mid(parsed) and pair.mid is None:
        raise ValueError(f"policy {policy!r} calls the mid drafter but the pair has none")
    if is_adaptive(parsed):  # a fresh rule per request; its costs from the runtime context, else
        # from the models' parameter ratio (a walk over every weight: only where it is read)
        ratio = parameter_ratio(pair.mid, pair.target) if runtime is None else None
        parsed = adaptive_for(str(parsed), ratio)
    check_prompt(pair, prompt, config, parsed)
    if parsed == AR:
        return (yield from _autoregressive_steps(pair, prompt, config))
    return (yield from _speculative_steps(pair, prompt, parsed, config, runtime, timing))


def check_block_prompt(
    pair: ModelPair, prompt: list[int], config: DecodeConfig, k: int, drafter: torch.nn.Module | None = None
) -> None:
    """check_prompt for 'ddtree': trees are at most k deep; a causal-LM stand-in runs k-1 past them."""
    check_prompt(pair, prompt, config, AR)
    need = len(prompt) + config.max_new_tokens + k
    models = [("target", pair.target)] + ([("block proposer", drafter)] if drafter is not None else [])
    for name, model in models:
        if need > context_of(model):
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({config.max_new_tokens}) + the deepest "
                f"DDTree ({k} tokens) = {need} exceeds the {name}'s context of {context_of(model)} tokens"
            )


if __name__ == "__main__":
    import sys

    # a library module: `python -m decoder.generate` once printed nothing and exited 0
    print("error: decoder.generate is a library; run `python -m decoder --help` to decode", file=sys.stderr)
    raise SystemExit(2)
