"""DVC stage ``zoo``: train the tokenizer, target models and distilled mid drafters.

Reads ``data.out_dir/corpus``; writes ``zoo.out_dir/<model>/`` (safetensors + tokenizer) and
``zoo.out_dir/zoo.json``.
"""

from __future__ import annotations

from config.params import Params, resolve
from pipeline.cli import run_stage


def main(params: Params) -> dict:
    from models.zoo import train_zoo  # heavy import (torch, transformers) kept off --help

    return train_zoo(params.zoo, resolve(params.data.out_dir), resolve(params.zoo.out_dir))


if __name__ == "__main__":
    run_stage("zoo", main)
