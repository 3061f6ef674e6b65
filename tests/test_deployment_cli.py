"""`python -m decoder --deployment DIR` (decoder/cli.py) on a bundle of a tiny pair saved to disk: the
bundle's models, template, tree and policy decode the prompt, the table's ``deployed`` row is the
bundle's policy beside AR and the endpoints, and bad bundles or flags are one line and exit 2."""

from __future__ import annotations

import os

import pytest
from conftest import save_pair, train_tokenizer
from test_cli import run_cli, stdlib_texts
from test_deployment import bundle_profile, record, shifted
from test_scheduler_export import student_artifact
from transformers import AutoTokenizer

from decoder.cli import main
from decoder.core.config import DecodeConfig
from decoder.generate import generate
from decoder.models.pair import load_pair
from decoder.models.templates import render
from models.bundle import write_index, write_pair_bundle

PROMPT = "def main():\n    return"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployed")
    save_pair(root / "models", train_tokenizer(stdlib_texts(), vocab=300), seed=41)
    _, student = student_artifact(root / "export" / "scheduler", seed=4, y_mean=-0.35, threshold=-0.54)
    folder = root / "deploy" / "tiny"
    models = {"target": os.path.relpath(root / "models" / "target", folder),
              "mid": os.path.relpath(root / "models" / "mid", folder),
              "dtype": "float32", "device": "cpu", "linear": "stock", "template": "zoo"}  # fmt: skip
    digest = write_pair_bundle(
        folder,
        record(student, shifted(student, -0.5), models=models),
        student.with_suffix(""),
        bundle_profile(student),
    )
    write_index(root / "deploy", {"tiny": digest})
    return root, digest


def rows(stdout: str) -> dict[str, list[str]]:
    names = ("ar ", "all-small ", "all-mid ", "deployed ")
    return {ln.split()[0]: ln.split() for ln in stdout.splitlines() if ln.startswith(names)}


def test_the_cli_decodes_with_the_bundle_and_shows_the_deployed_row(bundle, capsys):
    root, digest = bundle
    argv = ["--deployment", str(root / "deploy"), "--pair", "tiny", "--expect-sha256", digest]
    assert main([*argv, "--prompt", PROMPT, "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr()
    assert "pair tiny: deploys student:-0.50" in out.err
    table = rows(out.out)
    assert set(table) == {"ar", "all-small", "all-mid", "deployed"}
    assert all(r[-1] == "yes" for r in table.values())  # every row's tokens equal AR's
    assert table["ar"][3] == "1.00x" and table["ar"][6] == "+0.0%"
    assert 0.0 <= float(table["deployed"][5]) <= 1.0  # the share of steps that called the mid drafter
    # the text is the target's own greedy output on the prompt in the bundle's template
    pair = load_pair(root / "models" / "target")
    tok = AutoTokenizer.from_pretrained(root / "models" / "target", local_files_only=True)
    ids = tok.encode(render("zoo", [PROMPT]), add_special_tokens=False)
    text = tok.decode(generate(pair, ids, "ar", DecodeConfig(max_new_tokens=24)).new_tokens)
    assert out.out.split("\n\n")[0] == text


def test_switch_off_decodes_the_deployed_row_losslessly_and_needs_a_bundle(bundle, capsys):
    root, _ = bundle
    argv = ["--deployment", str(root / "deploy"), "--switch-off", "--prompt", PROMPT]
    assert main([*argv, "--max-new-tokens", "16"]) == 0
    assert rows(capsys.readouterr().out)["deployed"][-1] == "yes"  # tokens equal AR's
    assert main(["--target", str(root / "models" / "target"), "--switch-off", "--prompt", PROMPT]) == 2
    assert "--switch-off prices rounds with a bundle's latency profile" in capsys.readouterr().err


def test_the_cli_runs_as_a_module_with_the_bundle(bundle):
    root, _ = bundle
    out = run_cli("--deployment", str(root / "deploy"), "--prompt", PROMPT, "--max-new-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert rows(out.stdout)["deployed"][-1] == "yes"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--expect-sha256", "0" * 64], "differs from --expect-sha256"),
        (["--pair", "nope"], "no pair 'nope'; it holds ['tiny']"),
        (["--budget", "3"], "--budget: the bundle chooses the policy and tree shape"),
        (["--policy", "all-mid"], "--policy: the bundle chooses the policy and tree shape"),
    ],
)
def test_bad_bundle_flags_are_one_line_and_exit_2(bundle, capsys, extra, message):
    root, _ = bundle
    assert main(["--deployment", str(root / "deploy"), "--prompt", "x", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_a_missing_bundle_and_a_missing_target_are_one_line(tmp_path, capsys):
    assert main(["--deployment", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "no deployment bundle folder" in capsys.readouterr().err
    assert main(["--prompt", "x"]) == 2
    assert "pass --target PATH (and --mid PATH), or --deployment DIR" in capsys.readouterr().err
