"""DVC stage ``zoo``: train the tokenizer, target models, distilled mid drafters and block drafters.

Reads ``data.out_dir/corpus``; writes ``zoo.out_dir/<model>/`` (safetensors + tokenizer + the
folder's ``checkpoint_digest.json``, which loading verifies) and
``zoo.out_dir/zoo.json``; block drafters in ``zoo.out_dir/<name>/`` (block_drafter.json + .safetensors).
"""

from __future__ import annotations

from config.params import Params, resolve
from pipeline.cli import run_stage
from pipeline.tracking import log_metrics, stage_run


def _per_position(info: dict) -> dict:
    """Per-position agreement lists as one metric per position (held_out_top1.1, ...)."""
    keys = ("train_top1", "held_out_top1", "held_out_top1_before")
    return {key: {str(i + 1): v for i, v in enumerate(info[key])} for key in keys}


def main(params: Params) -> dict:
    from models.zoo import train_zoo  # heavy import (torch, transformers) kept off --help

    with stage_run("zoo", params):
        manifest = train_zoo(params.zoo, resolve(params.data.out_dir), resolve(params.zoo.out_dir))
        log_metrics({**manifest, "n_models": len(manifest["models"])})  # seconds, tokens, params
        blocks = manifest["block_drafters"]
        log_metrics({"block_drafters": {name: _per_position(info) for name, info in blocks.items()}})
    return manifest


if __name__ == "__main__":
    run_stage("zoo", main)
