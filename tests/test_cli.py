"""`python -m decoder` (decoder/cli.py) on checkpoints saved to disk: text, stats table, clear errors."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from conftest import save_pair, train_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from decoder.cli import main
from decoder.core.decode import encode_prompt
from decoder.models.templates import jinja_chat_template

ROOT = Path(__file__).resolve().parents[1]


def stdlib_texts() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:20]]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    save_pair(root, train_tokenizer(stdlib_texts(), vocab=300), seed=41)
    return root


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A pair whose tokenizer carries a ChatML chat template, as instruct checkpoints do."""
    root = tmp_path_factory.mktemp("chat")
    tok = train_tokenizer(stdlib_texts(), vocab=300)
    tok.chat_template = jinja_chat_template("chatml")
    save_pair(root, tok, seed=43)
    return root


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m decoder ARGS` in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "decoder", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def call_cli(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """decoder.cli.main(ARGS) in this process, ending as `python -m decoder` does (main's return
    value, or argparse's exit status), with what it printed: run_cli's result without the seconds
    of a fresh interpreter importing torch. test_cli_prints_text_and_side_by_side_table keeps the
    entry point itself covered."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as stop:
        code = stop.code
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["decoder", *args], code, printed.out, printed.err)


def table_of(stdout: str, policy: str = "10101") -> dict[str, list[str]]:
    return {ln.split()[0]: ln.split() for ln in stdout.splitlines() if ln.startswith(("ar ", f"{policy} "))}


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
    table = table_of(out.stdout)
    assert set(table) == {"ar", "10101"}
    assert table["ar"][3] == "1.00x" and table["10101"][-1] == "yes"


def test_cli_budget_caps_the_verified_tree(pair_dir, capsys):
    """--budget 1 verifies the root and one drafted node: at most one drafted token per round,
    where the default 63 accepts more (1.5 a round with this pair); both stay the target's text."""
    base = ["--target", str(pair_dir / "target"), "--mid", str(pair_dir / "mid"), "--policy", "all-mid"]
    prompt = ["--prompt", "def main():\n    return", "--max-new-tokens", "24"]
    small, full = call_cli(capsys, *base, *prompt, "--budget", "1"), call_cli(capsys, *base, *prompt)
    assert small.returncode == 0 and full.returncode == 0, (small.stderr, full.stderr)
    a_small, a_full = (
        float(table_of(small.stdout, "all-mid")["all-mid"][4]),
        float(table_of(full.stdout, "all-mid")["all-mid"][4]),
    )
    assert 0 < a_small <= 1.0 < a_full
    assert table_of(small.stdout, "all-mid")["all-mid"][-1] == "yes"
    assert small.stdout.split("\n\n")[0] == full.stdout.split("\n\n")[0]


def test_cli_tree_shape_flags_reach_the_tree(pair_dir, capsys):
    """--width 1 --topk 1 leaves the mid drafter one chain of depth D = 5 per round (the n-gram
    drafter's chains need a match, which a 24-token run rarely has), so at most 5 drafted tokens are
    accepted a round; the same text as the default 10 x 10 tree, which accepts more. --ngram-min-n 2
    is taken (a bad value is refused by name in test_cli_bad_input)."""
    base = ["--target", str(pair_dir / "target"), "--mid", str(pair_dir / "mid"), "--policy", "all-mid"]
    prompt = ["--prompt", "def main():\n    return", "--max-new-tokens", "24"]
    chain = call_cli(capsys, *base, *prompt, "--width", "1", "--topk", "1", "--ngram-min-n", "2")
    wide = call_cli(capsys, *base, *prompt)
    assert chain.returncode == 0 and wide.returncode == 0, (chain.stderr, wide.stderr)
    rows = table_of(chain.stdout, "all-mid")["all-mid"], table_of(wide.stdout, "all-mid")["all-mid"]
    assert rows[0][-1] == rows[1][-1] == "yes"
    assert float(rows[0][4]) <= 5 and float(rows[0][4]) < float(rows[1][4])
    assert chain.stdout.split("\n\n")[0] == wide.stdout.split("\n\n")[0]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_cli_onednn_linear_prints_the_same_text(pair_dir, capsys):
    """--linear onednn swaps the models' linear layers: the text (the target's greedy output) stays."""
    base = ["--target", str(pair_dir / "target"), "--mid", str(pair_dir / "mid"), "--policy", "10101"]
    prompt = ["--prompt", "def main():\n    return", "--max-new-tokens", "24"]
    stock, onednn = call_cli(capsys, *base, *prompt), call_cli(capsys, *base, *prompt, "--linear", "onednn")
    assert stock.returncode == 0 and onednn.returncode == 0, (stock.stderr, onednn.stderr)
    assert onednn.stdout.split("\n\n")[0] == stock.stdout.split("\n\n")[0]
    assert table_of(onednn.stdout)["10101"][-1] == "yes"
    bad = call_cli(capsys, *base, *prompt, "--linear", "mkl")
    assert bad.returncode == 2 and "invalid choice: 'mkl'" in bad.stderr


def greedy_text(folder: Path, ids: list[int], max_new: int) -> str:
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=tok.eos_token_id,
    )
    return tok.decode(out[0, len(ids) :].tolist())


@pytest.mark.parametrize("raw", [False, True])
def test_cli_on_a_chat_tokenizer(chat_dir, raw, capsys):
    """Both the chat-template path and --raw print the target's own greedy text and the table."""
    tok = AutoTokenizer.from_pretrained(chat_dir / "target", local_files_only=True)
    prompt = "def main():\n    return"
    ids = encode_prompt(tok, prompt, raw=raw)
    rendered = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    templated = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    # the template path is the tokenizer's own rendering; --raw is the bare prompt
    assert (ids == templated) != raw and ids == (tok(prompt)["input_ids"] if raw else templated)
    args = ["--target", str(chat_dir / "target"), "--mid", str(chat_dir / "mid"), "--prompt", prompt]
    out = call_cli(capsys, *args, "--policy", "10101", "--max-new-tokens", "20", *(["--raw"] if raw else []))
    assert out.returncode == 0, out.stderr
    expect = greedy_text(chat_dir / "target", ids, 20)
    assert out.stdout.startswith(expect + "\n\n"), (out.stdout, expect)
    table = table_of(out.stdout)
    assert set(table) == {"ar", "10101"} and table["10101"][-1] == "yes"
    assert int(table["ar"][1]) == int(table["10101"][1]) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "1010"], "string of 5 bits"),
        (["--prompt", ""], "prompt is empty"),
        (["--max-new-tokens", "0"], "max_new_tokens must be positive"),
        (["--budget", "0"], "--budget must be a positive number of tree nodes"),
        (["--width", "0"], "--width must be a positive number of tree nodes"),
        (["--topk", "-2"], "--topk must be a positive number of tree nodes"),
        (["--ngram-min-n", "6"], "--ngram-min-n must be in 1..5"),
    ],
)
def test_cli_bad_input(pair_dir, capsys, args, message):
    base = {"--target": str(pair_dir / "target"), "--mid": str(pair_dir / "mid"), "--prompt": "x = 1"}
    argv = [x for k, v in base.items() if k not in args for x in (k, v)] + args
    out = call_cli(capsys, *argv, "--raw")
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/nonexistent/model"], r"/nonexistent/model: not a model folder"),
        (["--dtype", "float8"], "dtype must be one of"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "tpu"], "device"),
        (["--device", "nonsense"], "is not a torch device"),
        (["--temperature", "nan"], "--temperature must be a finite number"),
        (["--mid", "/nonexistent/mid"], r"/nonexistent/mid: not a model folder"),
    ],
)
def test_cli_bad_paths_and_flags_are_one_clear_line(pair_dir, capsys, args, message):
    base = {"--target": str(pair_dir / "target"), "--mid": str(pair_dir / "mid"), "--prompt": "x = 1"}
    argv = [x for k, v in base.items() if k not in args for x in (k, v)] + args
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last


def test_cli_mid_policy_without_mid_is_a_clear_error(pair_dir, capsys):
    assert main(["--target", str(pair_dir / "target"), "--prompt", "x", "--policy", "all-mid"]) == 2
    assert "pass --mid PATH" in capsys.readouterr().err


def test_cli_malformed_flag_is_reported_by_argparse(pair_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--target", str(pair_dir / "target"), "--prompt", "x", "--max-new-tokens", "many"])
    assert exc.value.code == 2 and "invalid int value: 'many'" in capsys.readouterr().err


def test_cli_adaptive_policy_prints_the_targets_text(pair_dir, capsys):
    """--policy adaptive: the online rule beside AR, lossless; a malformed threshold is one error
    line before any model loads."""
    base = ["--target", str(pair_dir / "target"), "--mid", str(pair_dir / "mid"), "--raw"]
    prompt = ["--prompt", "def main():\n    return", "--max-new-tokens", "24"]
    assert main([*base, *prompt, "--policy", "adaptive:0.05:2"]) == 0
    rows = table_of(capsys.readouterr().out, "adaptive:0.05:2")
    assert set(rows) == {"ar", "adaptive:0.05:2"} and rows["adaptive:0.05:2"][-1] == "yes"
    assert main([*base, *prompt, "--policy", "adaptive:fast:2"]) == 2
    assert "MARGIN must be a number" in capsys.readouterr().err
