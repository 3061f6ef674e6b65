"""Execute mode: every schedule decodes every prompt for real, with target verification each round."""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.collect.records import RoundRecord
from decoder.core.config import DecodeConfig
from decoder.core.policies import StepContext
from decoder.core.state import step_signals
from decoder.generate import generate
from decoder.models.pair import ModelPair


@dataclass
class SignalRecorder:
    """A fixed schedule that also records the tree signals before every step."""

    bits: tuple[bool, ...]
    width: int
    signals: list[tuple[float, ...]] = field(default_factory=list)

    def __call__(self, ctx: StepContext) -> bool:
        self.signals.append(step_signals(ctx.state, self.width))
        return self.bits[ctx.step - 1]


def execute_prompt(
    pair: ModelPair, prompt: list[int], bits: tuple[bool, ...], config: DecodeConfig
) -> tuple[list[RoundRecord], int]:
    """Decode one prompt under a fixed schedule; return its rounds and the tokens they emitted (all but
    the first, which the prefill yields)."""
    recorder = SignalRecorder(bits, config.tree.width)
    res = generate(pair, prompt, recorder, config)
    depth = len(bits)
    records = []
    for i, r in enumerate(res.rounds):
        mids = [s for s in r.steps if s.used_mid]
        records.append(
            RoundRecord(
                accepted=r.accepted,
                emitted=r.emitted,
                verified_nodes=r.verified_size + 1,
                mid_tree_tokens=tuple(s.mid_tree_tokens for s in mids),
                mid_catch_up=sum(s.mid_catch_up for s in mids),
                small_steps=depth - len(mids),
                signals=tuple(recorder.signals[i * depth : (i + 1) * depth]),
                # Signal recording is collection overhead, not decoding: leave the scheduler out.
                measured_ms=1e3 * (sum(r.times.values()) - r.times["scheduler"]),
                tree_nodes=r.tree_size + 1,
                small_frontier=sum(s.frontier_size for s in r.steps if not s.used_mid),
                mid_lag=r.mid_lag,
                prompt_blocks=r.prompt_blocks,
            )
        )
    return records, res.decoded_tokens
