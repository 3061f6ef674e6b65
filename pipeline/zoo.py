"""DVC stage ``zoo``: train the tokenizer, target models and distilled mid drafters.

Reads ``data.out_dir/corpus``; writes ``zoo.out_dir/<model>/`` (safetensors + tokenizer) and
``zoo.out_dir/zoo.json``.
"""

from __future__ import annotations

from config.params import Params, resolve
from pipeline.cli import run_stage
from pipeline.tracking import log_metrics, stage_run


def main(params: Params) -> dict:
    from models.zoo import train_zoo  # heavy import (torch, transformers) kept off --help

    with stage_run("zoo", params):
        manifest = train_zoo(params.zoo, resolve(params.data.out_dir), resolve(params.zoo.out_dir))
        log_metrics({**manifest, "n_models": len(manifest["models"])})  # seconds, tokens, params
    return manifest


if __name__ == "__main__":
    run_stage("zoo", main)
