"""Real rounds on a fixed reference context: what collectors.pricing.profiling times, built as the decoder
builds them.

`Reference` caches one context of real text in a target verifier, an n-gram drafter and a mid
drafter, and rewinds them between timed calls; `real_rounds` builds one round per fixed schedule
with the decoder's RoundBuilder and keeps every state a scheduler saw; `prefix_tree` cuts a real
tree to a given size (parents come before children, so the first n nodes are a tree);
`student_like` is a scheduler of the exported student's shape for timing decisions.
"""

from __future__ import annotations

import itertools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from decoder.core.config import TreeConfig
from decoder.core.construct import RoundBuilder
from decoder.core.mid import MidDrafter
from decoder.core.ngram import NgramDrafter
from decoder.core.policies import BuildState, StepContext, schedule_bits
from decoder.core.state import SIGNAL_NAMES, state_feature_names
from decoder.core.tensors import crop_cache
from decoder.core.timing import make_clock, zero_times
from decoder.core.tree import DraftTree
from decoder.core.verify import TargetVerifier
from decoder.deploy.artifact import Artifact
from decoder.deploy.scheduler import LearnedScheduler
from decoder.models.pair import ModelPair

STUDENT_SHAPE = (17, 64, 32, 1)


@dataclass(frozen=True)
class PreStep:
    """The build state a scheduler saw before one step of a real round, and what it chose."""

    step: int
    history: tuple[bool, ...]
    state: BuildState
    invoke: bool


@dataclass(frozen=True)
class RealRounds:
    """One real round per schedule on the reference context."""

    trees: list[DraftTree]  # each round's tree before the prune
    steps: list[PreStep]


def reference_context(pair: ModelPair, n_tokens: int, seed: int = 0) -> list[int]:
    """n_tokens ids with the repetition of real text, so n-gram steps find matches: this Python's
    stdlib source through the pair's tokenizer, or (no tokenizer) phrases from a small random bank."""
    ids: list[int] = []
    if pair.tokenizer is not None:
        for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            text = src.read_text(errors="ignore")
            ids += [t for t in pair.tokenizer(text)["input_ids"] if t < pair.vocab_size]
            if len(ids) >= n_tokens:
                return ids[:n_tokens]
    rng = np.random.default_rng(seed)
    bank = rng.integers(1, pair.vocab_size, size=(32, 8))
    while len(ids) < n_tokens:
        ids += bank[rng.integers(len(bank))].tolist()
    return ids[:n_tokens]


def random_tree(n_nodes: int, root: int, vocab: int, rng: np.random.Generator) -> DraftTree:
    """A random prefix-closed tree of exactly n_nodes nodes, the root included."""
    return grown(DraftTree(root), n_nodes, vocab, rng, max_depth=n_nodes)


def grown(tree: DraftTree, n_nodes: int, vocab: int, rng: np.random.Generator, max_depth: int) -> DraftTree:
    """A copy of tree with random children added (parents no deeper than max_depth - 1) up to n_nodes."""
    out = tree.copy()
    shallow = [v for v in range(len(out)) if out.depths[v] < max_depth and out.alive[v]]
    while len(out) < n_nodes:
        v, new = out.add_child(shallow[int(rng.integers(len(shallow)))], int(rng.integers(vocab)), -1.0)
        if new and out.depths[v] < max_depth:
            shallow.append(v)
    return out


def prefix_tree(tree: DraftTree, n_nodes: int) -> DraftTree:
    """The tree of tree's first n_nodes nodes (same indices: parents always come first)."""
    if not 1 <= n_nodes <= len(tree):
        raise ValueError(f"n_nodes must be in [1, {len(tree)}], got {n_nodes}")
    out = DraftTree(tree.tokens[0])
    for v in range(1, n_nodes):
        out.add_child(tree.parents[v], tree.tokens[v], tree.edge_logp[v], tree.created_step[v])
    return out


def student_like(depth: int, width: int, rng: np.random.Generator) -> LearnedScheduler:
    """A student of the exported shape with random weights: the decision work, not its answers."""
    n_fixed = len(state_feature_names(depth, ()))
    signals = SIGNAL_NAMES[: max(0, STUDENT_SHAPE[0] - n_fixed)]
    names = list(state_feature_names(depth, signals))
    sizes = [len(names), *STUDENT_SHAPE[1:]]
    arrays = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        arrays[f"margin.{i}.weight"] = rng.normal(size=(b, a)).astype(np.float32)
        arrays[f"margin.{i}.bias"] = rng.normal(size=b).astype(np.float32)
    manifest = {
        "kind": "student",
        "depth": depth,
        "width": width,
        "feature_names": names,
        "input_names": names,
        "x_mean": [0.0] * len(names),
        "x_std": [1.0] * len(names),
        "heads": {"margin": sizes},
        "y_mean": {"margin": 0.0},
        "y_std": {"margin": 1.0},
        "threshold": 0.0,
    }
    return LearnedScheduler(Artifact(manifest, arrays), signals)


class Reference:
    """The reference context cached in a target verifier, an n-gram drafter and a mid drafter."""

    def __init__(self, pair: ModelPair, context: list[int], cfg: TreeConfig) -> None:
        self.context, self.n_ctx = context, len(context) - 1  # the last token is every tree's root
        self.verifier = TargetVerifier(pair.target, pair.vocab_size, cfg.topk)
        self.rows = self.verifier.prefill(context[:-1]).rows  # the context's rows, a block on demand
        self.top = self.rows.all()
        self.ngram = NgramDrafter.for_tree(cfg)
        self.ngram.commit(context)
        self.ngram.cache.set_rows(self.top.start, self.top.tokens, self.top.logps)
        self.mid = MidDrafter(pair.mid, pair.vocab_size) if pair.mid is not None else None
        if self.mid is not None:
            self.mid.rescore(DraftTree(context[-1]), context)  # catch up on the context once
            self.rewind_mid()
        self.builder = RoundBuilder(cfg, self.ngram, self.mid, make_clock(pair.target.device))

    def rewind_target(self) -> None:
        crop_cache(self.verifier.cache, self.n_ctx)

    def rewind_mid(self) -> None:
        """Drop this round's tree KV so the mid cache holds exactly the reference context again."""
        assert self.mid is not None
        self.mid.end_round([])
        crop_cache(self.mid.cache, self.n_ctx)
        self.mid.n_committed = self.n_ctx


def real_rounds(ref: Reference, depth: int) -> RealRounds:
    """One round per fixed schedule (all 2^D with a mid, else all-small), built as generate does."""
    ids = range(2**depth) if ref.mid is not None else [0]
    trees: list[DraftTree] = []
    steps: list[PreStep] = []
    for s in ids:
        bits = schedule_bits(s, depth)

        def schedule(ctx: StepContext, bits: tuple[bool, ...] = bits) -> bool:
            steps.append(PreStep(ctx.step, ctx.history, ctx.state.copy(), bits[ctx.step - 1]))
            return bits[ctx.step - 1]

        tree, _ = ref.builder.build(ref.context, schedule, zero_times())
        trees.append(tree)
        if ref.mid is not None:
            ref.rewind_mid()
    return RealRounds(trees, steps)
