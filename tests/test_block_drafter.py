"""The block drafter: trains on a tiny real target, proposes sorted marginals, saves and reloads
exactly, and refuses edited files. Features are computed here with the target's own HF forward,
exactly as decoder/graft/block.py defines them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from collectors.data.embedded_data import stdlib_files
from config.params import BlockDrafterSpec, ModelSpec, TrainParams
from decoder.cli import main
from decoder.graft.drafter import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    BlockDrafter,
    BlockDrafterConfig,
    BlockDrafterError,
    BlockDrafterNet,
    load_block_drafter,
    save_block_drafter,
    spread_layers,
)
from decoder.models.checkpoint import DIGEST_FILE
from models.block_training import fit_block_drafter
from models.checksums import record_folder
from models.lm_training import build_model, greedy_continuations, lm_loss, sample_windows, train_loop
from models.tokenizer_training import train_tokenizer

TRAIN = TrainParams(seq_len=64, batch_size=16, lr=0.004, warmup_steps=10, threads=1, corpus_chars=1)
SPEC = BlockDrafterSpec(target="t", corpus=(), k=4, target_layers=2, context=16, layers=1, d_model=64,
                        heads=2, ffn=128, steps=250, batch_size=32, lr=0.003, gamma=7.0, sequences=64,
                        new_tokens=32, held_out=8)  # fmt: skip


def spec(**shape: int) -> ModelSpec:
    """An untrained zoo target of ``shape`` (layers, d_model, heads, ffn)."""
    return ModelSpec(arch="qwen3", kv_heads=1, steps=0, teacher="", init_from="", distill_prompts=0,
                     distill_new_tokens=0, corpus=(), **shape)  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> dict:
    """A 2-layer Qwen3 target pretrained briefly on stdlib source, and a block drafter trained on it."""
    torch.manual_seed(0)
    text = [p.read_text(encoding="utf-8", errors="replace")[:6000] for p in stdlib_files()[:60]]
    tok = train_tokenizer(text, 384, 2, "zoo")
    tokens = np.fromiter((t for d in text for t in tok.encode(d, add_special_tokens=False)), dtype=np.int32)
    target = build_model(spec(layers=2, d_model=64, heads=2, ffn=128), len(tok), tok.eos_token_id, 512)
    rng = np.random.default_rng(0)
    train_loop(target, lambda _: sample_windows(tokens, 16, 64, rng), lm_loss, 150, TRAIN, "tiny target")
    target.eval().requires_grad_(False)
    prompts = sample_windows(tokens, 96, 16, rng)
    net, info = fit_block_drafter(SPEC, target, target, prompts[:64], tokens, TRAIN, seed=1)
    return {
        "target": target,
        "net": net,
        "info": info,
        "tokens": tokens,
        "fresh_prompts": prompts[64:],
        "tok": tok,
    }


def _features(target: PreTrainedModel, committed: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """decoder/graft/block.py's features: hidden states at ``layers`` of every position but the root."""
    with torch.no_grad():
        out = target(input_ids=torch.tensor([committed[:-1]]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


def _propose(drafter: BlockDrafter, target: PreTrainedModel, committed: list[int], m: int = 5):
    return drafter.propose(_features(target, committed, drafter.target_layers), committed, m)


def test_training_lowers_the_held_out_loss(tiny: dict) -> None:
    info = tiny["info"]
    assert info["held_out_loss"] < 0.7 * info["held_out_loss_before"]
    assert len(info["held_out_top1"]) == len(info["train_top1"]) == SPEC.k
    assert info["held_out_top1"][0] > info["held_out_top1"][-1]  # later positions are harder
    assert info["seconds"] > 0 and info["target_layers"] == [1, 2]


def test_position_one_predicts_the_targets_next_greedy_token(tiny: dict) -> None:
    """On fresh greedy text, slot 1 must match the target's argmax after the root (t + 1): a drafter
    trained on labels shifted by one would match the root itself or the token after instead."""
    target, drafter = tiny["target"], BlockDrafter(tiny["net"])
    seqs = greedy_continuations(target, tiny["fresh_prompts"], 24, batch=32)
    hits, shifted, later, n = 0, 0, 0, 0
    for seq in seqs.tolist():
        for cut in (18, 22, 27, 31):
            committed = seq[:cut]
            with torch.no_grad():
                nxt = int(target(input_ids=torch.tensor([committed])).logits[0, -1].argmax())
            top = _propose(drafter, target, committed).ids[:, 0]
            hits += int(top[0] == nxt)
            shifted += int(top[0] == committed[-1])
            later += int(top[0] == seq[cut + 1])
            n += 1
    labels = np.concatenate([s[17:] for s in seqs.numpy()])
    most_frequent = np.bincount(labels).max() / len(labels)  # trivial baseline on this very text
    assert hits / n > max(0.5, most_frequent + 0.2, shifted / n + 0.3, later / n + 0.2)


def test_propose_returns_k_rows_of_sorted_log_probs(tiny: dict) -> None:
    target, drafter = tiny["target"], BlockDrafter(tiny["net"])
    committed = tiny["tokens"][:40].tolist()
    marg = _propose(drafter, target, committed, m=7)
    assert marg.ids.shape == marg.logps.shape == (SPEC.k, 7) and marg.ids.dtype == np.int64
    assert np.all(np.diff(marg.logps, axis=1) <= 0) and np.all(marg.logps <= 0)
    assert np.all(np.exp(marg.logps).sum(1) <= 1 + 1e-9)
    assert all(len(set(row)) == 7 for row in marg.ids.tolist())
    short = drafter.propose(torch.zeros(0, tiny["net"].cfg.feature_dim), committed[:1], 3)
    assert short.ids.shape == (SPEC.k, 3)  # a one-token context has no features yet
    with pytest.raises(ValueError, match="features must be"):
        drafter.propose(torch.zeros(3, 5), committed[:4], 3)


def test_only_the_last_c_positions_matter(tiny: dict) -> None:
    target, drafter = tiny["target"], BlockDrafter(tiny["net"])
    committed = tiny["tokens"][:40].tolist()
    feats = _features(target, committed, drafter.target_layers)
    base = drafter.propose(feats, committed, 5)
    far, near = feats.clone(), feats.clone()
    far[: len(feats) - SPEC.context] += 3.0
    near[-1] += 3.0
    assert np.array_equal(drafter.propose(far, committed, 5).logps, base.logps)
    assert not np.allclose(drafter.propose(near, committed, 5).logps, base.logps)


def test_save_load_round_trip_gives_identical_marginals(tiny: dict, tmp_path: Path) -> None:
    target, net = tiny["target"], tiny["net"]
    save_block_drafter(net, tmp_path / "bd", extra={"target": "t"})
    saved = load_file(str(tmp_path / "bd" / WEIGHTS_NAME))
    assert not any(net.cfg.vocab_size in v.shape for v in saved.values())  # embedding / head not saved
    loaded = load_block_drafter(tmp_path / "bd", target)
    assert loaded.k == SPEC.k and loaded.target_layers == (1, 2)
    committed = tiny["tokens"][100:140].tolist()
    a, b = _propose(BlockDrafter(net), target, committed), _propose(loaded, target, committed)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.logps, b.logps)


def test_edited_files_are_refused_naming_file_and_field(tiny: dict, tmp_path: Path) -> None:
    target, folder = tiny["target"], tmp_path / "bd"
    meta = save_block_drafter(tiny["net"], folder)
    weights = folder / WEIGHTS_NAME
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(BlockDrafterError, match=rf"{CONFIG_NAME}: field 'weights_sha256' does not match"):
        load_block_drafter(folder, target)
    save_block_drafter(tiny["net"], folder)
    raw = json.loads(meta.read_text())
    meta.write_text(json.dumps({**raw, "context": raw["context"] + 1}))
    with pytest.raises(BlockDrafterError, match=rf"{CONFIG_NAME}: field 'config_sha256'"):
        load_block_drafter(folder, target)
    meta.write_text(json.dumps({k: v for k, v in raw.items() if k != "k"}))
    with pytest.raises(BlockDrafterError, match=rf"{CONFIG_NAME}: field 'k' is missing"):
        load_block_drafter(folder, target)


def test_a_drafter_for_another_target_is_refused(tiny: dict, tmp_path: Path) -> None:
    save_block_drafter(tiny["net"], tmp_path / "bd")
    other = build_model(spec(layers=2, d_model=32, heads=2, ffn=64), tiny["net"].cfg.vocab_size, 0, 64)
    with pytest.raises(BlockDrafterError, match=r"field 'target_hidden' is 64, the target has 32"):
        load_block_drafter(tmp_path / "bd", other)
    with pytest.raises(BlockDrafterError, match=rf"nothing/{CONFIG_NAME}: missing"):
        load_block_drafter(tmp_path / "nothing", tiny["target"])


def test_training_leaves_the_target_untouched(tiny: dict) -> None:
    target = tiny["target"]
    before = {k: v.clone() for k, v in target.state_dict().items()}
    fit_block_drafter(SPEC.model_copy(update={"steps": 3, "sequences": 8, "held_out": 2}), target, target,
                      tiny["fresh_prompts"], tiny["tokens"], TRAIN, seed=2)  # fmt: skip
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert not any(p.requires_grad for p in target.parameters())


def test_target_layers_spread_over_the_depth() -> None:
    assert spread_layers(160, 3) == (1, 80, 160)
    assert spread_layers(3, 3) == (1, 2, 3)
    assert spread_layers(1, 3) == (1,)
    cfg = BlockDrafterConfig(k=4, target_layers=(1,), context=8, layers=1, d_model=30, heads=4, ffn=8,
                             target_hidden=16, vocab_size=10)  # fmt: skip
    with pytest.raises(ValueError, match="d_model 30 is not a multiple of heads 4"):
        BlockDrafterNet(cfg)


def test_a_corrupted_weight_file_is_refused_by_the_folder_digest_record(tiny: dict, tmp_path: Path) -> None:
    target, folder = tiny["target"], tmp_path / "bd"
    save_block_drafter(tiny["net"], folder)
    record_folder(folder)  # as the zoo stage does
    weights = folder / WEIGHTS_NAME
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 0x10  # tensor data, same size: safetensors itself would load it
    weights.write_bytes(bytes(blob))
    with pytest.raises(BlockDrafterError) as info:
        load_block_drafter(folder, target)
    message = str(info.value)
    assert message.startswith(f"{weights}: SHA-256") and f"{folder / DIGEST_FILE}" in message
    assert "corrupt" in message


def test_the_cli_decodes_ddtree_with_a_saved_block_drafter(tiny: dict, tmp_path: Path, capsys) -> None:
    """`python -m decoder --policy ddtree --block-drafter DIR`: the target's own text (the table's
    lossless column against AR), drafted by the saved drafter; the flag beside another policy, or
    a drafter folder that is not one, is one clear error."""
    tiny["target"].save_pretrained(tmp_path / "target")
    tiny["tok"].save_pretrained(tmp_path / "target")
    save_block_drafter(tiny["net"], tmp_path / "bd")
    text = tiny["tok"].decode(tiny["tokens"][100:140].tolist())
    argv = ["--target", str(tmp_path / "target"), "--prompt", text, "--raw", "--max-new-tokens", "24"]
    assert main([*argv, "--policy", "ddtree", "--block-drafter", str(tmp_path / "bd")]) == 0
    rows = {
        ln.split()[0]: ln.split()
        for ln in capsys.readouterr().out.splitlines()
        if ln.startswith(("ar ", "ddtree "))
    }
    assert set(rows) == {"ar", "ddtree"} and rows["ddtree"][-1] == "yes"
    assert main([*argv, "--policy", "all-small", "--block-drafter", str(tmp_path / "bd")]) == 2
    assert "--block-drafter serve --policy ddtree only" in capsys.readouterr().err
    assert main([*argv, "--policy", "ddtree", "--block-drafter", str(tmp_path / "target")]) == 2
    assert "block_drafter.json: missing" in capsys.readouterr().err
