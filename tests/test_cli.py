"""`python -m decoder.generate` on checkpoints saved to disk: text, stats table, clear errors."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import save_pair, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:20]]
    root = tmp_path_factory.mktemp("cli")
    save_pair(root, train_tokenizer(texts, vocab=300), seed=41)
    return root


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "decoder.generate", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_cli_prints_text_and_side_by_side_table(pair_dir):
    out = run_cli(
        "--target",
        str(pair_dir / "target"),
        "--mid",
        str(pair_dir / "mid"),
        "--prompt",
        "def main():\n    return",
        "--policy",
        "10101",
        "--max-new-tokens",
        "24",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    table = {ln.split()[0]: ln.split() for ln in lines if ln.startswith(("ar ", "10101 "))}
    assert set(table) == {"ar", "10101"}
    assert table["ar"][3] == "1.00x" and table["10101"][-1] == "yes"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "1010"], "string of 5 bits"),
        (["--prompt", ""], "prompt is empty"),
        (["--max-new-tokens", "0"], "max_new_tokens must be positive"),
    ],
)
def test_cli_bad_input(pair_dir, args, message):
    base = {"--target": str(pair_dir / "target"), "--mid": str(pair_dir / "mid"), "--prompt": "x = 1"}
    argv = [x for k, v in base.items() if k not in args for x in (k, v)] + args
    out = run_cli(*argv, "--raw")
    assert out.returncode == 2 and message in out.stdout
