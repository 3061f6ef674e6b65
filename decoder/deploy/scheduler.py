"""Learned scheduling policies from exported artifacts, NumPy only (no torch, no pickle).

Artifacts (weights + manifest, every field checked, both checksummed) are written and read by
decoder/deploy/artifact.py; its names are re-exported here for callers that load a scheduler.

Contract: :func:`load_scheduler` / :func:`load_value_planner` read an artifact through
:func:`read_artifact` (which refuses anything malformed or edited), then also refuse a feature
order this decoder does not compute (context, history for D, then known tree signals) and, given
the decoder's TreeConfig, a different D or W. Normalization is folded into the first and last
layers at load, so a decision is three small matmuls.

The policies are decoder schedulers: ``generate(pair, ids, policy, config, runtime=...)``; they
need the RuntimeContext (the context features come from it) and raise a clear error without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from decoder.core.policies import RoundBackoff, RuntimeContext, StepContext
from decoder.core.state import (
    SIGNAL_NAMES,
    context_features,
    history_features,
    state_feature_names,
    step_signals,
)
from decoder.deploy.artifact import (
    KINDS,
    SCHEMA_VERSION,
    Artifact,
    ManifestError,
    artifact_paths,
    build_manifest,
    read_artifact,
    write_artifact,
)
from decoder.deploy.planning import HEADS, search_margins, suffix_feature_names

__all__ = [
    "KINDS",
    "SCHEMA_VERSION",
    "Artifact",
    "LearnedScheduler",
    "ManifestError",
    "ValuePlanner",
    "artifact_paths",
    "build_manifest",
    "load_scheduler",
    "load_value_planner",
    "read_artifact",
    "write_artifact",
]


def decoder_feature_names(depth: int, signals: Sequence[str]) -> tuple[str, ...]:
    """The state z this decoder computes online for the given signals (decoder.core.state's order)."""
    try:
        return state_feature_names(depth, signals)
    except ValueError as err:
        raise ManifestError(f"{err}: not computed by this decoder") from err


def check_features(manifest: dict, depth: int | None, width: int | None) -> tuple[str, ...]:
    """Validate D, W and the feature order against this decoder; return the signal names."""
    d = int(manifest["depth"])
    if depth is not None and d != depth:
        raise ManifestError(f"artifact was trained for D = {d} drafting steps, the decoder runs D = {depth}")
    if width is not None and int(manifest["width"]) != width:
        raise ManifestError(f"artifact was trained for W = {manifest['width']}, the decoder runs W = {width}")
    names = tuple(manifest["feature_names"])
    n_fixed = len(decoder_feature_names(d, ()))  # context + history; the rest are tree signals
    expected = decoder_feature_names(d, names[n_fixed:])
    if names != expected:
        raise ManifestError(f"feature order {list(names)} differs from this decoder's {list(expected)}")
    return names[n_fixed:]


class Mlp:
    """One head in NumPy float64 with input standardization and output de-standardization folded in."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        head: str,
        n_layers: int,
        x_mean: Sequence[float],
        x_std: Sequence[float],
        y_mean: float,
        y_std: float,
    ) -> None:
        ws = [arrays[f"{head}.{i}.weight"].astype(np.float64).T for i in range(n_layers)]
        bs = [arrays[f"{head}.{i}.bias"].astype(np.float64) for i in range(n_layers)]
        x_mean, x_std = np.asarray(x_mean, dtype=np.float64), np.asarray(x_std, dtype=np.float64)
        ws[0] = ws[0] / x_std[:, None]
        bs[0] = bs[0] - x_mean @ ws[0]
        ws[-1], bs[-1] = ws[-1] * y_std, bs[-1] * y_std + y_mean
        self.layers = [(np.ascontiguousarray(w), b) for w, b in zip(ws, bs, strict=True)]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(n, in) or (in,) -> (n,) or scalar array, in original target units."""
        h = x
        for w, b in self.layers[:-1]:
            h = np.maximum(h @ w + b, 0.0)
        w, b = self.layers[-1]
        return (h @ w + b)[..., 0]


def _heads(art: Artifact) -> dict[str, Mlp]:
    m = art.manifest
    return {
        head: Mlp(
            art.arrays, head, len(sizes) - 1, m["x_mean"], m["x_std"], m["y_mean"][head], m["y_std"][head]
        )
        for head, sizes in m["heads"].items()
    }


class _OnlineFeatures:
    """z for a StepContext: context (cached per runtime), history, chosen tree signals."""

    def __init__(self, signals: Sequence[str], width: int) -> None:
        self.signals, self.width = tuple(signals), width
        self.idx = [SIGNAL_NAMES.index(s) for s in self.signals]
        self._runtime: RuntimeContext | None = None
        self._context: tuple[float, ...] = ()

    def __call__(self, ctx: StepContext) -> np.ndarray:
        if ctx.runtime is None:
            raise ValueError(
                "a learned scheduler needs the runtime context: call generate(..., "
                "runtime=RuntimeContext(prompt_tokens, target_ms, mid_ms)) with warm-up timings"
            )
        if ctx.runtime is not self._runtime:
            self._runtime, self._context = ctx.runtime, context_features(ctx.runtime)
        sig = step_signals(ctx.state, self.width)
        hist = history_features(ctx.step, ctx.depth, ctx.history, ctx.mid_lag, sig[-1])
        return np.array([*self._context, *hist, *(sig[i] for i in self.idx)])


class LearnedScheduler:
    """The distilled student: invoke the mid drafter iff its predicted margin is > the manifest's
    ``threshold`` (0 when the artifact has none).

    With ``skip_rest_below`` = g in the manifest, a margin below threshold - g also skips every
    later step of the round without deciding (no tree signals, no MLP): ``decided`` is then False
    for those steps, and the decoder counts (and the pricing charges) only the decisions taken.
    With ``skip_rest_max_target_ms`` = T as well, the gate applies only where the runtime context's
    target_ms is at most T: the decisions it saves are worth something only where a round is cheap.

    With ``skip_rounds_max`` = c > 0 (cross-round backoff): a round is idle when no margin it decided
    came above threshold - h, h = ``skip_rounds_margin`` (absent: 0, so idle = the student called
    the mid drafter at none of its steps). After k idle rounds in a row in which it decided, the next
    min(2^k - 1, c) rounds are skipped whole without deciding (every step answers False with
    ``decided`` False); the round after a skip-run decides again, and a round that calls the mid
    drafter, or comes within h of calling it, sets k back to 0 (decoder.core.policies.RoundBackoff). A
    round starts at step 1. The state belongs to one generation: :meth:`reset` (called through
    decoder.core.policies.start_generation by ``generate`` and by the policy replay for every prompt)
    starts it afresh.
    """

    def __init__(self, art: Artifact, signals: Sequence[str]) -> None:
        self.manifest = art.manifest
        self.depth = int(art.manifest["depth"])
        self.net = _heads(art)["margin"]
        self.threshold = float(art.manifest["threshold"])
        gate = art.manifest.get("skip_rest_below")
        self.skip_rest_below = None if gate is None else self.threshold - float(gate)
        cap = art.manifest.get("skip_rest_max_target_ms")
        self.skip_rest_max_target_ms = None if cap is None else float(cap)
        self.skip_rounds_max = int(art.manifest.get("skip_rounds_max", 0))
        self.backoff = RoundBackoff(self.skip_rounds_max)
        self.engaged_above = self.threshold - float(art.manifest.get("skip_rounds_margin", 0.0))
        self.features = _OnlineFeatures(signals, int(art.manifest["width"]))
        self.reset()

    def reset(self) -> None:
        """Start a generation: no round open, no idle rounds counted, nothing to skip."""
        self.decided = True  # whether the last call decided (see decoder.core.policies.decision_taken)
        self._rest_skipped = False  # the rest of this round is skipped (skip_rest_below)
        self._round_skipped = False  # this whole round is skipped (backoff)
        self.backoff.reset()

    def margin(self, z: np.ndarray) -> float:
        """Predicted margin (manifest ``margin_units``) for one state vector z."""
        return float(self.net(z))

    def decide(self, z: np.ndarray) -> bool:
        return bool(self.net(z) > self.threshold)

    def __call__(self, ctx: StepContext) -> bool:
        if ctx.depth != self.depth:
            raise ManifestError(
                f"scheduler was trained for D = {self.depth}, the decoder runs D = {ctx.depth}"
            )
        if ctx.step == 1:
            self._round_skipped, self._rest_skipped = self.backoff.start_round(), False
        if self._round_skipped or self._rest_skipped:
            self.decided = False
            return False
        self.decided = True
        score = float(self.net(self.features(ctx)))
        if score > self.engaged_above:
            self.backoff.engaged()
        if score > self.threshold:
            return True
        if self.skip_rest_below is not None and score < self.skip_rest_below and self._gated(ctx.runtime):
            self._rest_skipped = True
        return False

    def _gated(self, runtime: RuntimeContext) -> bool:
        """Whether the skip-the-rest gate applies at this runtime's target_ms."""
        return self.skip_rest_max_target_ms is None or runtime.target_ms <= self.skip_rest_max_target_ms


class ValuePlanner:
    """The ablation: plan online with the value system (exhaustive suffix search), no student."""

    def __init__(self, art: Artifact, signals: Sequence[str]) -> None:
        self.manifest = art.manifest
        self.depth = int(art.manifest["depth"])
        heads = _heads(art)
        self.heads = [heads[h] for h in HEADS]
        self.features = _OnlineFeatures(signals, int(art.manifest["width"]))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(n, 23) value inputs -> (n, 4) predictions in HEADS order, original units."""
        return np.stack([h(x) for h in self.heads], axis=1)

    def margin(self, z: np.ndarray, step: int) -> float:
        return float(search_margins(self.predict, np.asarray(z)[None], [step], self.depth).margin[0])

    def __call__(self, ctx: StepContext) -> bool:
        if ctx.depth != self.depth:
            raise ManifestError(
                f"value system was trained for D = {self.depth}, the decoder runs D = {ctx.depth}"
            )
        return self.margin(self.features(ctx), ctx.step) > 0.0


def _checked(
    art: Artifact, where: Path | str, kind: str, depth: int | None, width: int | None
) -> tuple[Artifact, tuple[str, ...]]:
    signals = check_features(art.manifest, depth, width)
    want_inputs = [
        *art.manifest["feature_names"],
        *(suffix_feature_names(int(art.manifest["depth"])) if kind == "value" else ()),
    ]
    if list(art.manifest["input_names"]) != want_inputs:
        raise ManifestError(f"{where}: input_names {art.manifest['input_names']} differ from {want_inputs}")
    return art, signals


def load_scheduler(path: Path | str, depth: int | None = None, width: int | None = None) -> LearnedScheduler:
    """Load and validate an exported student (pass the decoder's D and W to check them too)."""
    return scheduler_from(read_artifact(path, "student"), path, depth, width)


def scheduler_from(
    art: Artifact, where: Path | str, depth: int | None = None, width: int | None = None
) -> LearnedScheduler:
    """A student from an artifact already read and validated as one (``where`` names it in errors),
    checked as :func:`load_scheduler` checks a file."""
    art, signals = _checked(art, where, "student", depth, width)
    if list(art.manifest["heads"]) != ["margin"]:
        raise ManifestError(f"{where}: a student has one head 'margin', got {list(art.manifest['heads'])}")
    return LearnedScheduler(art, signals)


def load_value_planner(path: Path | str, depth: int | None = None, width: int | None = None) -> ValuePlanner:
    """Load and validate an exported value system as a planning policy."""
    art, signals = _checked(read_artifact(path, "value"), path, "value", depth, width)
    if list(art.manifest["heads"]) != list(HEADS):
        raise ManifestError(
            f"{path}: a value system has heads {list(HEADS)}, got {list(art.manifest['heads'])}"
        )
    return ValuePlanner(art, signals)
