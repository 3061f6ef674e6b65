"""The output every GRAFT row must emit on a prompt: the target's greedy continuation, found where
another stage already decoded it.

Contract: the output of a decode of ``graft_eval.max_new_tokens`` new tokens is the target's greedy
continuation cut to that many tokens and ending after its first EOS (:func:`cut_outputs`). The
evaluate_graft stage takes it, in order of preference, from the continuations the evaluate_fixed
stage stored for the same cell on the same prompts (:func:`stored_outputs`), from those the collect
stage stored for the same pair and prompts (:func:`collected_outputs`), or from a batched greedy
decode (:func:`greedy_outputs`). Each source gives every prompt's output or none (None); a batch
can break a near-tie the other way, so the walks check every output with the lossless gate
(collectors/graft/walk.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from collectors.collect.batch_greedy import greedy_batch
from collectors.collect.report import prompt_digest
from collectors.evaluation.priced_eval import Cell, PricedCell, prompts_digest
from config.params import Params
from decoder.models.pair import ModelPair


def cut_outputs(gs: Sequence[Sequence[int]], n: int, eos: Sequence[int]) -> list[list[int]] | None:
    """Each continuation's first ``n`` tokens, ending after its first EOS: the greedy output a
    decode of ``n`` new tokens emits; None if one is shorter than ``n``."""
    if any(len(g) < n for g in gs):
        return None
    stop, outputs = set(eos), []
    for g in gs:
        out = [int(t) for t in g[:n]]
        end = next((i + 1 for i, t in enumerate(out) if t in stop), n)
        outputs.append(out[:end])
    return outputs


def collected_outputs(
    params: Params, collected: Mapping[tuple[str, str], Sequence[int]], pair_id: str,
    prompts: Sequence[list[int]], eos: Sequence[int],
) -> list[list[int]] | None:  # fmt: skip
    """The target's greedy output of each prompt (as :func:`stored_outputs`), cut from the
    continuations the collect stage stored for the same pair and prompts (``collected``:
    collectors.collect.report.read_continuations); None unless it holds one for every prompt."""
    gs = [collected.get((pair_id, prompt_digest(p))) for p in prompts]
    if any(g is None for g in gs):
        return None
    return cut_outputs(gs, params.graft_eval.max_new_tokens, eos)  # type: ignore[arg-type]


def stored_outputs(
    params: Params,
    parts: Mapping[Cell, PricedCell],
    cell: Cell,
    prompts: Sequence[list[int]],
    eos: Sequence[int],
) -> list[list[int]] | None:
    """The target's greedy output of each of the cell's prompts (``graft_eval.max_new_tokens``,
    ending after its first EOS), cut from the continuations the evaluate_fixed stage stored for the
    same cell on the same prompts; None where it has none for them (a pair or a prompt count of
    this stage's own)."""
    part = parts.get(cell)
    if part is None or part.prompts_sha256 != prompts_digest(prompts):
        return None
    return cut_outputs([g for g, _ in part.continuations], params.graft_eval.max_new_tokens, eos)


def greedy_outputs(
    pair: ModelPair, prompts: Sequence[list[int]], max_new_tokens: int, known: list[list[int]] | None
) -> list[list[int]]:
    """``known`` (the outputs a stage stored) where given, else the prompts' greedy outputs decoded
    in a batch."""
    if known is not None:
        return known
    return greedy_batch(pair.target, prompts, max_new_tokens, pair.vocab_size, pair.eos_token_ids)
