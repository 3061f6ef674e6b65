"""Zoo spec -> trained tokenizer and models on disk.

Contract: :func:`train_zoo` reads the corpus written by the data stage (``<data>/corpus/*.jsonl``),
trains one BPE tokenizer, every target (LM training, from scratch or from another zoo model) and
then every mid drafter (distilled from its ``teacher`` target), each on its ``corpus`` files, and
writes ``<out>/<model>/`` with ``save_pretrained`` (safetensors) plus the same tokenizer files in
each folder. Then every block drafter (models/block_training.py) trains on its frozen target and
is written to ``<out>/<name>/`` (decoder/graft/drafter.py's files; it loads onto that target).
``<out>/zoo.json`` holds sizes, losses and timings (block drafters under ``block_drafters``, with
per-position top-1 agreement) and every folder's file digests, also written into the folder as
``checkpoint_digest.json`` (decoder/models/checkpoint.py), which loading checks. Deterministic given
``zoo.seed`` and ``train.threads``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from config.params import ModelSpec, ZooParams
from decoder.graft.drafter import save_block_drafter
from decoder.models.templates import get_template
from models.block_training import fit_block_drafter
from models.checksums import record_folder
from models.lm_training import (
    build_model,
    greedy_continuations,
    grow_model,
    kd_loss,
    lm_loss,
    param_count,
    sample_windows,
    train_loop,
)
from models.tokenizer_training import tokenizer_digest, train_tokenizer

log = logging.getLogger(__name__)


def read_corpus(data_dir: Path, max_chars: int, seed: int, names: Sequence[str] = ()) -> list[str]:
    """Documents from the named corpus files (all when ``names`` is empty), shuffled, cut to
    ``max_chars`` characters in total."""
    files = sorted((data_dir / "corpus").glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{data_dir / 'corpus'}: no *.jsonl corpus files; run the data stage")
    if names:
        unknown = sorted(set(names) - {f.stem for f in files})
        if unknown:
            raise FileNotFoundError(f"{data_dir / 'corpus'}: no corpus file(s) {unknown}.jsonl; "
                                    f"have {[f.stem for f in files]}")  # fmt: skip
        files = [f for f in files if f.stem in names]
    docs: list[str] = []
    for path in files:
        with path.open(encoding="utf-8") as fh:
            docs += [json.loads(line)["text"] for line in fh if line.strip()]
    random.Random(seed).shuffle(docs)
    out, total = [], 0
    for d in docs:
        if total >= max_chars:
            break
        out.append(d)
        total += len(d)
    return out


def chat_prompts(
    docs: list[str], tokenizer: PreTrainedTokenizerFast, template: str, length: int
) -> torch.Tensor:
    """[N, length] prompts ending at the assistant prefix, cut from chat documents in the corpus."""
    prefix = get_template(template).assistant_prefix
    rows = []
    for d in docs:
        if prefix and prefix in d:
            ids = tokenizer.encode(d[: d.index(prefix) + len(prefix)], add_special_tokens=False)
            if len(ids) >= length:
                rows.append(ids[-length:])
    if not rows:
        raise ValueError("no chat prompts in the corpus to distill on")
    return torch.tensor(rows, dtype=torch.long)


def _train_target(spec: ModelSpec, tokens: np.ndarray, zoo: ZooParams, seed: int,
                  tok: PreTrainedTokenizerFast, name: str,
                  init: PreTrainedModel | None) -> tuple[PreTrainedModel, dict]:  # fmt: skip
    torch.manual_seed(seed)
    if init is not None:
        model = grow_model(init, spec, tok.eos_token_id)
        if spec.steps == 0:  # grown only: exactly the source's function at a higher cost
            return model.eval(), {"loss": None, "seconds": 0.0}
    else:
        model = build_model(spec, len(tok), tok.eos_token_id, 4096)
    rng = np.random.default_rng(seed)
    tr = zoo.train
    res = train_loop(model, lambda _: sample_windows(tokens, tr.batch_size, tr.seq_len, rng),
                     lm_loss, spec.steps, tr, f"target {name}")  # fmt: skip
    return model, {"loss": res.final_loss, "seconds": res.seconds}


def _train_mid(spec: ModelSpec, tokens: np.ndarray, zoo: ZooParams, seed: int,
               tok: PreTrainedTokenizerFast, name: str, teacher: PreTrainedModel,
               prompts: torch.Tensor) -> tuple[PreTrainedModel, dict]:  # fmt: skip
    torch.manual_seed(seed)
    tr = zoo.train
    t0 = time.perf_counter()
    idx = torch.randperm(len(prompts))[: spec.distill_prompts]
    gen = greedy_continuations(teacher, prompts[idx], spec.distill_new_tokens, batch=32)
    gen_s = time.perf_counter() - t0
    model = build_model(spec, len(tok), tok.eos_token_id, 4096)
    rng = np.random.default_rng(seed)

    def next_batch(step: int) -> torch.Tensor:
        # Alternate teacher continuations and corpus windows of the same length.
        if step % 2 == 0:
            return gen[torch.from_numpy(rng.integers(0, len(gen), tr.batch_size))]
        return sample_windows(tokens, tr.batch_size, gen.size(1), rng)

    res = train_loop(model, next_batch, kd_loss(teacher), spec.steps, tr, f"mid {name}")
    return model, {"loss": res.final_loss, "seconds": res.seconds + gen_s, "distill_gen_s": gen_s}


def training_order(models: dict[str, ModelSpec]) -> list[str]:
    """Names sorted so every teacher / init_from model is trained before it is needed."""
    deps = {n: {d for d in (s.teacher, s.init_from) if d} for n, s in models.items()}
    unknown = set().union(*deps.values()) - set(models)
    if unknown:
        raise ValueError(f"zoo models name unknown teacher/init_from model(s) {sorted(unknown)}")
    order: list[str] = []
    while len(order) < len(models):
        ready = sorted(n for n in models if n not in order and deps[n] <= set(order))
        if not ready:
            raise ValueError(f"cycle among zoo models {sorted(set(models) - set(order))}")
        order += ready[:1]
    return order


def cheapest_equivalent(models: dict[str, ModelSpec], name: str) -> str:
    """The model computing ``name``'s exact function at least cost.

    A target grown with ``steps: 0`` is its source's function (grow_model is exact, and a test
    checks it), so distilling from its outputs may query the source: same logits, far cheaper.
    """
    spec = models[name]
    while spec.init_from and spec.steps == 0:
        name, spec = spec.init_from, models[spec.init_from]
    return name


class _Corpora:
    """Training tokens and distillation prompts per corpus selection, each computed once."""

    def __init__(self, data_dir: Path, zoo: ZooParams, tok: PreTrainedTokenizerFast) -> None:
        self.data_dir, self.zoo, self.tok = data_dir, zoo, tok
        self.docs: dict[tuple[str, ...], list[str]] = {}
        self.tokens: dict[tuple[str, ...], np.ndarray] = {}
        self.prompts: dict[tuple[str, ...], torch.Tensor] = {}

    def _docs(self, key: tuple[str, ...]) -> list[str]:
        if key not in self.docs:
            self.docs[key] = read_corpus(self.data_dir, self.zoo.train.corpus_chars, self.zoo.seed + 1, key)
        return self.docs[key]

    def tokens_of(self, names: tuple[str, ...]) -> np.ndarray:
        key = tuple(sorted(names))
        if key not in self.tokens:
            encoded = self.tok.backend_tokenizer.encode_batch(self._docs(key), add_special_tokens=False)
            self.tokens[key] = np.fromiter((t for enc in encoded for t in enc.ids), dtype=np.int32)
        return self.tokens[key]

    def prompts_of(self, names: tuple[str, ...]) -> torch.Tensor:
        key = tuple(sorted(names))
        if key not in self.prompts:
            self.prompts[key] = chat_prompts(self._docs(key), self.tok, self.zoo.template, 32)
        return self.prompts[key]


def check_block_targets(zoo: ZooParams) -> None:
    """Every block drafter names a zoo target (not a mid drafter) and no model's folder."""
    for name, spec in zoo.block_drafters.items():
        if name in zoo.models:
            raise ValueError(f"zoo.block_drafters.{name}: the name is taken by a zoo model")
        if spec.target not in zoo.models or zoo.models[spec.target].teacher:
            targets = sorted(n for n, s in zoo.models.items() if not s.teacher)
            raise ValueError(
                f"zoo.block_drafters.{name}.target: {spec.target!r} is not a zoo target; have {targets}"
            )


def _train_blocks(
    zoo: ZooParams, corpora: _Corpora, trained: dict[str, PreTrainedModel], out_dir: Path
) -> dict:
    infos = {}
    for i, name in enumerate(sorted(zoo.block_drafters)):
        spec = zoo.block_drafters[name]
        generator = trained[cheapest_equivalent(zoo.models, spec.target)]  # same function, cheaper
        prompts, tokens = corpora.prompts_of(spec.corpus), corpora.tokens_of(spec.corpus)
        seed = zoo.seed * 1000 + 500 + i
        net, info = fit_block_drafter(spec, trained[spec.target], generator, prompts, tokens, zoo.train, seed)
        save_block_drafter(net, out_dir / name, extra={"target": spec.target})
        info["files_sha256"] = record_folder(out_dir / name)
        log.info("block drafter %s: %.1f s, held-out top-1 %s", name, info["seconds"],
                 [round(a, 3) for a in info["held_out_top1"]])  # fmt: skip
        infos[name] = info | {"corpus": list(spec.corpus)}
    return infos


def train_zoo(zoo: ZooParams, data_dir: Path, out_dir: Path) -> dict:
    """Train tokenizer, targets, mids, then block drafters; write everything under ``out_dir``;
    return the manifest."""
    torch.set_num_threads(zoo.train.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    order = training_order(zoo.models)
    check_block_targets(zoo)
    t_start = time.perf_counter()
    docs = read_corpus(data_dir, zoo.tokenizer.max_chars, zoo.seed)
    tok = train_tokenizer(docs, zoo.tokenizer.vocab_size, zoo.tokenizer.min_frequency, zoo.template)
    corpora = _Corpora(data_dir, zoo, tok)
    tokens = corpora.tokens_of(())
    manifest: dict = {"tokenizer_s": time.perf_counter() - t_start, "corpus_tokens": len(tokens),
                      "models": {}}  # fmt: skip
    log.info("tokenizer + corpus: %d tokens, %.1f s", len(tokens), manifest["tokenizer_s"])
    trained: dict[str, PreTrainedModel] = {}
    for i, name in enumerate(order):
        spec, seed = zoo.models[name], zoo.seed * 1000 + i
        tokens = corpora.tokens_of(spec.corpus)
        if spec.teacher:
            teacher = trained[cheapest_equivalent(zoo.models, spec.teacher)]
            prompts = corpora.prompts_of(spec.corpus)
            model, info = _train_mid(spec, tokens, zoo, seed, tok, name, teacher, prompts)
        else:
            init = trained[spec.init_from] if spec.init_from else None
            model, info = _train_target(spec, tokens, zoo, seed, tok, name, init)
        trained[name] = model
        path = out_dir / name
        model.generation_config.pad_token_id = tok.eos_token_id
        model.save_pretrained(path)
        tok.save_pretrained(path)
        info |= {"params": param_count(model), "teacher": spec.teacher, "corpus": list(spec.corpus),
                 "tokenizer_sha256": tokenizer_digest(path),
                 "files_sha256": record_folder(path)}  # fmt: skip
        manifest["models"][name] = info
    manifest["block_drafters"] = _train_blocks(zoo, corpora, trained, out_dir)
    manifest["total_s"] = time.perf_counter() - t_start
    (out_dir / "zoo.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log.info("zoo trained in %.1f s", manifest["total_s"])
    return manifest
