"""Downloads are pinned by SHA-256 and refused when tampered; downloaded code never runs in-process."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import random
import sys
import zipfile
from pathlib import Path

import pytest

from collectors.data import embedded_data, gsm_runner
from collectors.data.embedded_data import (
    GeneratorOutputError,
    PinError,
    build_gsm,
    download,
    fetch_sdist,
    parse_gsm_output,
    verify_sha256,
)
from config.params import PinnedPackage

ROOT = Path(__file__).resolve().parents[1]


def _wheel(folder: Path, name: str = "fakepkg", version: str = "1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/data.txt", "payload")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a local folder of wheels (no network, no configured indexes)."""
    index = tmp_path / "index"
    _wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_pinned_wheel_downloads_and_a_wrong_hash_is_refused(local_index: Path, tmp_path: Path) -> None:
    good = hashlib.sha256((local_index / "fakepkg-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    (tmp_path / "a").mkdir()
    got = download(PinnedPackage(requirement="fakepkg==1.0", sha256=good), tmp_path / "a")
    assert got.name == "fakepkg-1.0-py3-none-any.whl"
    (tmp_path / "b").mkdir()
    with pytest.raises(PinError, match=r"^fakepkg==1\.0: .*does not match its pinned SHA-256: refused"):
        download(PinnedPackage(requirement="fakepkg==1.0", sha256="0" * 64), tmp_path / "b")
    assert not list((tmp_path / "b").iterdir())


def test_malformed_pins_are_refused(tmp_path: Path) -> None:
    # params would refuse both (config/params.py); download() checks them again on its own
    bad = [("fakepkg", "0" * 64), ("fakepkg==1.0", "ABC")]
    for pin in (PinnedPackage.model_construct(requirement=r, sha256=h) for r, h in bad):
        with pytest.raises(PinError, match="need name==version and a 64-hex-digit sha256"):
            download(pin, tmp_path)


def test_a_file_that_differs_from_its_pin_is_deleted(tmp_path: Path) -> None:
    path = tmp_path / "x.whl"
    path.write_bytes(b"tampered")
    pin = PinnedPackage(requirement="x==1", sha256=hashlib.sha256(b"original").hexdigest())
    with pytest.raises(PinError, match=r"^x==1: x\.whl has SHA-256 [0-9a-f]{64}, pinned"):
        verify_sha256(path, pin)
    assert not path.exists()


def test_tampered_source_archive_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sdist comes from the simple API (no pip build backend) and is hash-checked."""
    served = {
        "https://index.test/simple/some-pkg/": json.dumps(
            {"files": [{"filename": "some_pkg-2.0.tar.gz", "url": "../../files/some_pkg-2.0.tar.gz"}]}
        ).encode(),
        "https://index.test/files/some_pkg-2.0.tar.gz": b"not the pinned archive",
    }

    def urlopen(req, timeout):
        url = req if isinstance(req, str) else req.full_url
        return io.BytesIO(served[url])

    monkeypatch.setattr(embedded_data.urllib.request, "urlopen", urlopen)
    pin = PinnedPackage(requirement="some_pkg==2.0", sha256=hashlib.sha256(b"the real archive").hexdigest())
    path = fetch_sdist(pin, tmp_path, index="https://index.test/simple")
    assert path.read_bytes() == b"not the pinned archive"
    with pytest.raises(PinError, match=r"^some_pkg==2\.0: some_pkg-2\.0\.tar\.gz has SHA-256"):
        verify_sha256(path, pin)
    assert not path.exists()


GENERATORS = """
import os, sys
from reasoning_gym.utils import tag
CALLS = [0]

def generate_0(rng, difficulty=1.0):
    return {"question": tag(f"pid={os.getpid()} isolated={sys.flags.isolated} "
                            f"no_site={sys.flags.no_site} x={rng.randint(0, 99)}"),
            "answer": "7", "metadata": {"answer_cot": "so #### 7"}}

def generate_1(rng, difficulty=1.0):
    CALLS[0] += 1
    if CALLS[0] > 2:
        raise ValueError("template exhausted")
    return {"question": f"q1 {rng.random()}", "answer": "1", "metadata": {}}
"""


def _gsm_wheel(tmp_path: Path, second: str = "") -> Path:
    path = tmp_path / "reasoning_gym-0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("reasoning_gym/__init__.py", "raise RuntimeError('package init must not run')\n")
        zf.writestr("reasoning_gym/utils.py", "def tag(s):\n    return 'Q: ' + s\n")
        zf.writestr("reasoning_gym/arithmetic/gsm_symbolic/generators_00_49.py", GENERATORS)
        zf.writestr("reasoning_gym/arithmetic/gsm_symbolic/generators_50_99.py", second)
    return path


def test_generators_run_in_an_isolated_process_with_validated_output(tmp_path: Path) -> None:
    rng = random.Random("seed")
    built = build_gsm(_gsm_wheel(tmp_path), 3, rng)
    assert not [m for m in sys.modules if m.startswith("reasoning_gym")]
    questions = [q.turns[0] for q in built.questions["gsm8k"]]
    texts = built.corpus["gsm8k"]
    assert len(questions) == 3 and len(questions) + len(texts) == 25 + 2
    own = [q for q in questions + texts if "pid=" in q]
    assert own and all(f"pid={os.getpid()} " not in q for q in own)
    assert all("isolated=1 no_site=1" in q for q in own)
    # the parent's generator advanced by the child's draws: 25 + 3 (the third call fails), then shuffled
    ref = random.Random("seed")
    for _ in range(25 + 3):
        ref.randrange(2**31)
    ref.shuffle(list(range(27)))
    assert rng.getstate() == ref.getstate()


def test_a_failing_generator_process_is_reported(tmp_path: Path) -> None:
    with pytest.raises(GeneratorOutputError, match="generator process failed"):
        build_gsm(_gsm_wheel(tmp_path, second="import numpy\n"), 3, random.Random(0))  # no site-packages


def test_malformed_generator_output_is_rejected(tmp_path: Path) -> None:
    bad_item = """
def generate_0(rng, difficulty=1.0):
    return {"question": 42, "answer": "x", "metadata": {}}
"""
    wheel = _gsm_wheel(tmp_path, second=bad_item)
    with pytest.raises(GeneratorOutputError, match=r"item \d+: question must be a non-empty string, got 42"):
        build_gsm(wheel, 3, random.Random(0))


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("not json", "is not JSON"),
        ("[]", "exactly n_templates, draws, items"),
        ('{"n_templates": 1, "draws": 1, "items": [], "extra": 0}', "exactly n_templates, draws, items"),
        ('{"n_templates": 0, "draws": 0, "items": []}', "n_templates >= 1"),
        ('{"n_templates": 1, "draws": true, "items": []}', "must be integers"),
        ('{"n_templates": 1, "draws": 26, "items": []}', "draws <= 25"),
        ('{"n_templates": 1, "draws": 0, "items": [{"question": "q", "answer": "a"}]}', "len\\(items\\)"),
        ('{"n_templates": 1, "draws": 1, "items": [{"question": "q"}]}', "item 0 must be an object"),
        ('{"n_templates": 1, "draws": 1, "items": [{"question": " ", "answer": "a"}]}', "item 0: question"),
        ('{"n_templates": 1, "draws": 1, "items": [{"question": "q", "answer": 4}]}', "item 0: answer"),
    ],
)
def test_output_validation(text: str, detail: str) -> None:
    with pytest.raises(GeneratorOutputError, match=rf"^gen\.whl: generator output .*{detail}"):
        parse_gsm_output(text, 25, "gen.whl")
    assert parse_gsm_output('{"n_templates": 1, "draws": 2, "items": [{"question": "q", "answer": ""}]}',
                            25, "w").draws == 2  # fmt: skip


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return {n.split(".")[0] for n in names}


def test_the_data_stage_cannot_load_downloaded_modules() -> None:
    assert not {"importlib", "runpy", "types"} & _imports(ROOT / "collectors" / "data" / "embedded_data.py")
    tree = ast.parse((ROOT / "collectors" / "data" / "embedded_data.py").read_text(encoding="utf-8"))
    called = {
        n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }
    assert not called & {"exec", "eval", "exec_module", "__import__", "import_module", "run_path"}
    runner = _imports(Path(gsm_runner.__file__))
    assert runner <= set(sys.stdlib_module_names) | {"__future__"}, runner
