"""The pipeline run's headline: a few figures picked out of the hundreds of stage metrics on it.

Contract: :func:`headline_metrics` reads a parent run's copied stage metrics (``<stage>/<metric>``,
flattened with '.', as pipeline/tracking.py copies them) and returns ``headline/<name>`` for each
:data:`HEADLINE` pattern that matches one of them (absent figures are left out, never invented),
each stage's minutes (``headline/minutes.<stage>``) and the pipeline's (their sum). Pure: MLflow is
pipeline/tracking.py's business.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# (headline name, pattern over the copied ``<stage>/<metric>`` names)
HEADLINE = (
    ("deployed_gain_fitting_mean", r"evaluate/deployed\.priced_speedup\.fitting\.student_gain_mean"),
    ("deployed_gain_fitting_worst", r"evaluate/deployed\.priced_speedup\.fitting\.student_gain_worst"),
    ("pricing_ci_within_share", r"wall_check/summary\.stage\.ci_within_share"),
    ("graft_full_speedup", r"evaluate_graft/mean_speedup\.full"),
    ("graft_hindsight_speedup", r"evaluate_graft/mean_speedup\.hindsight"),
    ("graft_full_at_least_hindsight", r"evaluate_graft/full_graft_at_least_hindsight"),
)


def headline_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The parent run's headline from its copied stage metrics: HEADLINE's figures where present,
    each stage's minutes and the pipeline's (the sum of the stages that ran)."""
    out = {}
    for name, pattern in HEADLINE:
        found = [v for k, v in metrics.items() if re.fullmatch(pattern, k)]
        if found:
            out[f"headline/{name}"] = found[0]
    minutes = {k.split("/")[0]: v / 60 for k, v in metrics.items() if k.endswith("/stage_seconds")}
    out.update({f"headline/minutes.{stage}": m for stage, m in minutes.items()})
    if minutes:
        out["headline/minutes.pipeline"] = sum(minutes.values())
    return out
