"""Model folders carry a SHA-256 record (decoder/models/checkpoint.py) that loading checks: a flipped bit
or a cut file is one clear error naming the file, and the CLI turns it into exit 2 and one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import save_pair, train_tokenizer

from decoder.models import checkpoint
from decoder.models.checkpoint import DIGEST_FILE, CheckpointError, verify_folder
from decoder.models.pair import load_causal_lm, load_pair
from models.checksums import record_folder

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["def main():\n    return x + 1\n" * 20, "for i in range(10):\n    print(i)\n" * 20]


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    save_pair(tmp_path, train_tokenizer(TEXTS, vocab=120), seed=5)
    for name in ("target", "mid"):
        record_folder(tmp_path / name)
    return tmp_path


def flip_bits(path: Path, *positions: int) -> None:
    data = bytearray(path.read_bytes())
    for pos in positions:
        data[pos] ^= 0x10
    path.write_bytes(bytes(data))


def test_record_lists_every_file_and_a_clean_folder_loads(pair: Path) -> None:
    record = json.loads((pair / "target" / DIGEST_FILE).read_text())
    files = {p.name for p in (pair / "target").iterdir()} - {DIGEST_FILE}
    assert set(record) == files and "model.safetensors" in record
    assert verify_folder(pair / "target")
    load_pair(pair / "target", pair / "mid")


def test_two_flipped_bits_in_the_weights_are_refused(pair: Path) -> None:
    weights = pair / "target" / "model.safetensors"
    size = weights.stat().st_size
    flip_bits(weights, size - 100, size - 3)  # tensor data: safetensors itself would load it
    with pytest.raises(CheckpointError, match=r"target/model\.safetensors: SHA-256 .* does not match"):
        load_causal_lm(pair / "target")


@pytest.mark.parametrize("recorded", [True, False])
def test_a_truncated_checkpoint_is_one_error_naming_the_file(pair: Path, recorded: bool) -> None:
    if not recorded:  # a user's own folder: no record, the safetensors header still tells
        (pair / "target" / DIGEST_FILE).unlink()
    weights = pair / "target" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"target/model\.safetensors: .*truncated"):
        load_causal_lm(pair / "target")


def test_a_file_the_record_lists_must_exist(pair: Path) -> None:
    (pair / "mid" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"mid/tokenizer\.json: missing"):
        verify_folder(pair / "mid")


def test_a_verified_folder_is_hashed_once_until_a_file_changes(
    pair: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = checkpoint.sha256_of_file

    def counting(path: Path) -> str:
        calls.append(path.name)
        return real(path)

    monkeypatch.setattr(checkpoint, "sha256_of_file", counting)
    monkeypatch.setattr(checkpoint, "_verified", set())
    verify_folder(pair / "mid")
    n = len(calls)
    assert n == len(json.loads((pair / "mid" / DIGEST_FILE).read_text()))
    verify_folder(pair / "mid")
    assert len(calls) == n  # cached by (path, size, mtime)
    weights = pair / "mid" / "model.safetensors"
    flip_bits(weights, weights.stat().st_size - 7)  # same size, new mtime: hashed again, refused
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        verify_folder(pair / "mid")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_cli_on_a_corrupt_checkpoint_exits_2_with_one_line(pair: Path, damage: str) -> None:
    weights = pair / "target" / "model.safetensors"
    if damage == "flip":
        flip_bits(weights, weights.stat().st_size - 50, weights.stat().st_size - 51)
    else:
        weights.write_bytes(weights.read_bytes()[:4096])
    argv = ["--target", str(pair / "target"), "--mid", str(pair / "mid"), "--prompt", "x = 1", "--raw"]
    out = subprocess.run(
        [sys.executable, "-m", "decoder", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "model.safetensors" in lines[0], lines
