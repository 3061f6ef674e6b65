"""The model zoo on the smoke profile: trains, is deterministic, shares one tokenizer, and every
pair loads through the same code path as a real checkpoint (AutoModelForCausalLM by local path)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from collectors.data.embedded_data import stdlib_files
from config.params import ModelSpec, Params, load_params
from decoder.graft.drafter import load_block_drafter
from decoder.models.checkpoint import DIGEST_FILE, CheckpointError, verify_folder
from decoder.models.pair import TokenizerMismatchError, load_pair
from decoder.models.templates import get_template, render
from models.lm_training import build_model, grow_model
from models.tokenizer_training import tokenizer_digest
from models.zoo import cheapest_equivalent, check_block_targets, read_corpus, train_zoo, training_order


def _real_corpus(data_dir: Path) -> None:
    """A small corpus of real text without network: stdlib source plus chat-formatted docstrings."""
    corpus = data_dir / "corpus"
    corpus.mkdir(parents=True)
    files = stdlib_files()[:40]
    code = [p.read_text(encoding="utf-8", errors="replace")[:4000] for p in files]
    eos = get_template("zoo").eos_text
    chats = [
        render("zoo", [f"Explain the module {p.stem}."]) + text[:400] + eos
        for p, text in zip(files, code, strict=True)
    ]
    for name, docs in (("code", code), ("chat", chats)):
        rows = "".join(json.dumps({"text": d}) + "\n" for d in docs)
        (corpus / f"{name}.jsonl").write_text(rows, encoding="utf-8")


# The smoke zoo's chat models (and the chat target's block drafter) train on this corpus's "chat" file only.
CHAT_ONLY = {
    "models": {n: {"corpus": ["chat"]} for n in ("target-chat", "mid-chat")},
    "block_drafters": {"block-chat-l": {"corpus": ["chat"]}},
}


def _smoke_params(**zoo: object) -> Params:
    return load_params(profile="smoke", overrides={"zoo": {**CHAT_ONLY, **zoo}})


@pytest.fixture(scope="module")
def smoke_zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("zoo")
    _real_corpus(root / "data")
    params = _smoke_params(out_dir=str(root / "zoo"))
    manifest = train_zoo(params.zoo, root / "data", root / "zoo")
    return root / "zoo", manifest


def _weights_digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_every_model_is_saved_as_safetensors(smoke_zoo: tuple[Path, dict]) -> None:
    out, manifest = smoke_zoo
    params = load_params(profile="smoke")
    assert set(manifest["models"]) == set(params.zoo.models)
    for name in params.zoo.models:
        assert (out / name / "model.safetensors").is_file()
        assert not list((out / name).glob("*.bin"))
    assert json.loads((out / "zoo.json").read_text())["models"].keys() == manifest["models"].keys()


def test_all_models_share_one_tokenizer(smoke_zoo: tuple[Path, dict]) -> None:
    out, manifest = smoke_zoo
    digests = {tokenizer_digest(out / name) for name in manifest["models"]}
    assert len(digests) == 1
    tok = AutoTokenizer.from_pretrained(out / "mid-s", local_files_only=True)
    assert tok.eos_token == get_template("zoo").eos_text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == render("zoo", ["hi"])


def test_models_reload_like_real_checkpoints(smoke_zoo: tuple[Path, dict]) -> None:
    out, manifest = smoke_zoo
    ids = torch.tensor([[1, 2, 3, 4]])
    specs = load_params(profile="smoke").zoo.models
    for name in manifest["models"]:
        model = AutoModelForCausalLM.from_pretrained(out / name, local_files_only=True).eval()
        tok = AutoTokenizer.from_pretrained(out / name)
        cfg, spec = model.config, specs[name]
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (
            spec.layers,
            spec.d_model,
            spec.heads,
        )
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, 4, cfg.vocab_size) and cfg.vocab_size >= len(tok)
        assert torch.isfinite(logits).all()
        assert cfg.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(get_template("zoo").eos_text)


def _same_weights(model: torch.nn.Module, folder: Path) -> bool:
    """Every tensor saved in folder/model.safetensors equals the loaded model's (tied ones saved once)."""
    state = model.state_dict()
    saved = load_file(folder / "model.safetensors")
    return bool(saved) and all(torch.equal(state[k], v) for k, v in saved.items())


def test_every_pair_loads_through_the_runtime_loader(smoke_zoo: tuple[Path, dict]) -> None:
    """Each registered pair resolves to the zoo's own checkpoints, loaded weight for weight."""
    out, _ = smoke_zoo
    params = load_params(profile="smoke", overrides={"zoo": {"out_dir": str(out)}})
    tok = AutoTokenizer.from_pretrained(out / "mid-s", local_files_only=True)
    eos_id = tok.convert_tokens_to_ids(get_template("zoo").eos_text)
    for name, spec in params.pairs.items():
        target, mid = params.pair_paths(name)
        pair = load_pair(target, mid, dtype=spec.dtype, device=spec.device)
        for model, folder in ((pair.target, target), (pair.mid, mid)):
            want = params.zoo.models[folder.name]
            assert (model.config.num_hidden_layers, model.config.hidden_size) == (want.layers, want.d_model)
            assert _same_weights(model, folder), f"{name}: {folder.name} is not the saved checkpoint"
        assert pair.vocab_size == len(tok)
        assert eos_id in pair.eos_token_ids


def test_mismatched_tokenizer_is_refused(smoke_zoo: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = smoke_zoo
    other = tmp_path / "other"
    AutoModelForCausalLM.from_pretrained(out / "mid-s").save_pretrained(other)
    tok = AutoTokenizer.from_pretrained(out / "mid-s")
    tok.add_tokens(["<|not-shared|>"])
    tok.save_pretrained(other)
    with pytest.raises(TokenizerMismatchError, match="1 only in the mid's"):
        load_pair(out / "target-s", other)
    AutoTokenizer.from_pretrained(out / "mid-s").save_pretrained(other)
    assert load_pair(out / "target-s", other).mid is not None  # the same files with the shared one load


@pytest.mark.slow
def test_training_is_deterministic(smoke_zoo: tuple[Path, dict], tmp_path: Path) -> None:
    out, manifest = smoke_zoo
    _real_corpus(tmp_path / "data")
    params = _smoke_params()
    train_zoo(params.zoo, tmp_path / "data", tmp_path / "zoo")
    for name in manifest["models"]:
        assert _weights_digest(tmp_path / "zoo" / name) == _weights_digest(out / name)
    for name in manifest["block_drafters"]:
        again, first = (root / name / "block_drafter.safetensors" for root in (tmp_path / "zoo", out))
        assert again.read_bytes() == first.read_bytes(), name


def test_grown_model_computes_the_same_function() -> None:
    torch.manual_seed(0)
    shape = dict(arch="qwen3", d_model=32, heads=2, kv_heads=1, ffn=64, steps=1, teacher="", corpus=())
    unused = dict(distill_prompts=0, distill_new_tokens=0)
    small = ModelSpec(**shape, **unused, layers=2, init_from="")
    big = ModelSpec(**shape, **unused, layers=5, init_from="small")
    src = build_model(small, 100, 0, 64).eval()
    grown = grow_model(src, big, 0).eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        assert torch.allclose(src(input_ids=ids).logits, grown(input_ids=ids).logits, atol=1e-5)
    with pytest.raises(ValueError, match="keeps width"):
        grow_model(src, small.model_copy(update={"layers": 4, "d_model": 64}), 0)


def test_training_order_respects_dependencies() -> None:
    spec = load_params().zoo.models
    order = training_order(spec)
    for name, s in spec.items():
        for dep in (s.teacher, s.init_from):
            if dep:
                assert order.index(dep) < order.index(name)
    bad = dict(spec) | {"x": spec["mid-s"].__class__(**{**spec["mid-s"].__dict__, "teacher": "ghost"})}
    with pytest.raises(ValueError, match="ghost"):
        training_order(bad)


def test_grown_target_matches_its_source_on_disk(smoke_zoo: tuple[Path, dict]) -> None:
    """With steps: 0 the grown target is its source's function, which distillation relies on."""
    out, _ = smoke_zoo
    models = load_params(profile="smoke").zoo.models
    assert cheapest_equivalent(models, "target-l") == "target-m"
    assert cheapest_equivalent(models, "target-s") == "target-s"
    big = AutoModelForCausalLM.from_pretrained(out / "target-l").eval()
    small = AutoModelForCausalLM.from_pretrained(out / "target-m").eval()
    assert big.config.num_hidden_layers > small.config.num_hidden_layers
    ids = torch.randint(0, small.config.vocab_size, (1, 16))
    with torch.no_grad():
        assert torch.allclose(big(input_ids=ids).logits, small(input_ids=ids).logits, atol=1e-4)


def test_corpus_selection_reads_only_the_named_files(tmp_path: Path) -> None:
    _real_corpus(tmp_path)
    chat = read_corpus(tmp_path, 10**9, 0, ("chat",))
    every = read_corpus(tmp_path, 10**9, 0)
    assert chat and all(get_template("zoo").assistant_prefix in d for d in chat)
    assert len(every) == 2 * len(chat) and set(chat) < set(every)
    with pytest.raises(FileNotFoundError, match=r"no corpus file\(s\) \['news'\]"):
        read_corpus(tmp_path, 10**9, 0, ("chat", "news"))


def test_fine_tuned_target_differs_from_its_source_and_is_recorded(smoke_zoo: tuple[Path, dict]) -> None:
    """target-chat starts as a copy of target-s and is fine-tuned on the chat file alone."""
    out, manifest = smoke_zoo
    assert manifest["models"]["target-chat"]["corpus"] == ["chat"]
    assert manifest["models"]["target-s"]["corpus"] == []
    assert _weights_digest(out / "target-chat") != _weights_digest(out / "target-s")
    models = _smoke_params().zoo.models
    assert cheapest_equivalent(models, "target-chat-l") == "target-chat"


def test_block_drafters_are_saved_and_load_onto_their_targets(smoke_zoo: tuple[Path, dict]) -> None:
    """Each block drafter is in its own folder, pinned, and proposes K positions for its target."""
    out, manifest = smoke_zoo
    specs = load_params(profile="smoke").zoo.block_drafters
    assert set(manifest["block_drafters"]) == set(specs) and len(specs) >= 2
    for name, spec in specs.items():
        info = manifest["block_drafters"][name]
        assert info["target"] == spec.target and info["seconds"] > 0
        assert len(info["held_out_top1"]) == spec.k
        target = AutoModelForCausalLM.from_pretrained(out / spec.target, local_files_only=True).eval()
        drafter = load_block_drafter(out / name, target)
        assert drafter.k == spec.k and max(drafter.target_layers) == target.config.num_hidden_layers
        committed = [5, 9, 3, 7, 11]
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i][0] for i in drafter.target_layers], dim=-1)
        assert drafter.propose(feats, committed, 4).ids.shape == (spec.k, 4)


def test_block_drafter_targets_are_checked() -> None:
    zoo = load_params(profile="smoke").zoo
    ghost = {"b": zoo.block_drafters["block-m"].model_copy(update={"target": "mid-s"})}
    with pytest.raises(ValueError, match=r"zoo.block_drafters.b.target: 'mid-s' is not a zoo target"):
        check_block_targets(zoo.model_copy(update={"block_drafters": ghost}))
    taken = {"mid-s": zoo.block_drafters["block-m"]}
    with pytest.raises(ValueError, match=r"zoo.block_drafters.mid-s: the name is taken"):
        check_block_targets(zoo.model_copy(update={"block_drafters": taken}))


def test_every_zoo_folder_records_its_digests_and_loading_checks_them(
    smoke_zoo: tuple[Path, dict], tmp_path: Path
) -> None:
    out, manifest = smoke_zoo
    for section in ("models", "block_drafters"):
        for name, info in manifest[section].items():
            record = json.loads((out / name / DIGEST_FILE).read_text())
            assert record == info["files_sha256"], name  # zoo.json holds the same record
            on_disk = {p.name for p in (out / name).iterdir() if p.name != DIGEST_FILE}
            assert set(record) == on_disk, name
            assert verify_folder(out / name)
    copy = tmp_path / "target-s"
    shutil.copytree(out / "target-s", copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-11] ^= 0x01
    data[-12] ^= 0x80
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"target-s/model\.safetensors: SHA-256"):
        load_pair(copy, out / "mid-s")
