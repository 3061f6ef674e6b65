"""``make ui``: the MLflow UI on the project's store, every pipeline run with its headline.

``make repro`` closes its pipeline run with ``python -m pipeline.tracking end``, which logs the
run's headline (pipeline.tracking.headline_metrics: deployed gain, pricing agreement, GRAFT against
DDTree's best budget in hindsight, minutes per stage). A pipeline run that its stages grouped by
themselves (``dvc exp run -S distill.<param>=<value> evaluate``, a plain ``dvc repro``) is closed
by no one, so it would show none. Before the UI starts, :func:`fill_headlines` logs each pipeline
run's headline from the stage metrics copied onto it, wherever it lacks one or a later stage has
changed it; then ``pipeline.tracking ui`` prints the links (the two newest runs of each overlay side
by side) and serves the UI on 127.0.0.1. No stage imports this module: editing it reruns nothing.
"""

from __future__ import annotations

import argparse
import sys

from config.params import Params, load_params
from pipeline import tracking

# pipeline runs read per call of fill_headlines (the newest first); older runs keep what they have
MAX_RUNS = 200


def fill_headlines(params: Params) -> list[str]:
    """Log the headline of every pipeline run in the store whose logged headline differs from the
    one its copied stage metrics give; returns the ids of the runs it updated."""
    client, exp_id = tracking.open_store(params.mlflow)
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{tracking.KIND}` = 'pipeline'",
        order_by=["attributes.start_time DESC"],
        max_results=MAX_RUNS,
    )
    updated = []
    for run in runs:
        metrics = run.data.metrics
        want = tracking.headline_metrics(metrics)
        if want and any(metrics.get(k) != v for k, v in want.items()):
            tracking.log_headline(client, run.info.run_id)
            updated.append(run.info.run_id)
    return updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.ui", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", default=None, help="profiles/<name>.yaml overlay (default: params.yaml's)"
    )
    parser.add_argument("--port", default="5000")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    updated = fill_headlines(load_params(profile=args.profile))
    if updated:
        print(f"headline logged on {len(updated)} pipeline run(s) that no `make repro` closed")
    profile = ["--profile", args.profile] if args.profile else []
    return tracking.main([*profile, "ui", "--port", args.port])


if __name__ == "__main__":
    raise SystemExit(main())
