"""One pass of the profile stage's measurement with params.yaml's ``profile`` settings.

The profile stage (pipeline/profile.py, every pass) and evaluate's re-profile beside its wall-clock
cells (pipeline/evaluate.py) measure a pair the same way; the settings are unpacked here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collectors.pricing.profiling import measure_profile
from config.params import ProfileParams
from decoder.core.config import TreeConfig

if TYPE_CHECKING:
    from decoder.deploy.latency import LatencyProfile
    from decoder.models.pair import ModelPair


def measure_with_settings(
    pair: ModelPair, name: str, settings: ProfileParams, tree: TreeConfig
) -> LatencyProfile:
    """collectors.pricing.profiling.measure_profile of ``pair`` (named ``name``) with ``settings``' grid,
    warm-up, repeats and sampling, on real rounds of ``tree``."""
    return measure_profile(
        pair,
        name,
        context_len=settings.context_len,
        sizes=settings.sizes,
        warmup=settings.warmup,
        repeats=settings.repeats,
        mid_tokens=settings.mid_tokens,
        mid_fed=settings.mid_fed,
        samples_per_repeat=settings.samples_per_repeat,
        long_job_ms=settings.long_job_ms,
        tree_config=tree,
    )
