"""Question files that are not clean UTF-8 JSON lines fail naming the file and the line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collectors.data.prompts import PromptFileError, load_benchmarks, load_questions


def _line(qid: int, text: str) -> str:
    return json.dumps({"question_id": qid, "category": "demo", "turns": [text]}, ensure_ascii=False)


def _write_bytes(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_non_ascii_utf8_text_survives_intact(tmp_path: Path) -> None:
    texts = ["Résumé of the café", "把这句话翻译成英文", "emoji 🚀 at the end"]
    path = _write_bytes(
        tmp_path / "b" / "question.jsonl", [_line(i, t).encode("utf-8") for i, t in enumerate(texts)]
    )
    assert [q.turns[0] for q in load_questions(path)] == texts


def test_latin1_line_names_file_line_and_byte(tmp_path: Path) -> None:
    lines = [_line(1, "plain").encode(), _line(2, "fine").encode(), _line(3, "café").encode("latin-1")]
    path = _write_bytes(tmp_path / "bench" / "question.jsonl", lines)
    with pytest.raises(PromptFileError) as err:
        load_questions(path)
    message = str(err.value)
    assert message.startswith(f"{path}:3: not valid UTF-8")
    assert "0xe9" in message  # latin-1 é
    column = lines[2].index(b"\xe9") + 1
    assert f"column {column}" in message


def test_utf16_file_fails_on_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bench" / "question.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(_line(1, "hello") + "\n", encoding="utf-16")
    with pytest.raises(PromptFileError, match=rf"^{re.escape(str(path))}:1: not valid UTF-8"):
        load_questions(path)


def test_byte_order_mark_is_tolerated_on_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bench" / "question.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(_line(1, "hello") + "\n" + _line(2, "again") + "\n", encoding="utf-8-sig")
    assert [q.question_id for q in load_questions(path)] == [1, 2]


def test_truncated_last_line_names_its_line(tmp_path: Path) -> None:
    """A file cut mid-write: the last line is half a JSON object with no newline."""
    path = tmp_path / "bench" / "question.jsonl"
    path.parent.mkdir(parents=True)
    whole = _line(1, "one") + "\n" + _line(2, "two") + "\n"
    third = _line(3, "three")
    path.write_text(whole + third[: len(third) // 2], encoding="utf-8")
    with pytest.raises(PromptFileError, match=rf"^{re.escape(str(path))}:3: invalid JSON"):
        load_questions(path)


def test_benchmark_folder_reports_the_bad_file_among_good_ones(tmp_path: Path) -> None:
    _write_bytes(tmp_path / "good" / "question.jsonl", [_line(1, "ok").encode()])
    bad = _write_bytes(tmp_path / "bad" / "question.jsonl", [_line(1, "ok").encode(), b"\xff\xfe{}"])
    want = rf"^{re.escape(str(bad))}:2: not valid UTF-8 \(byte 0xff at column 1\)"
    with pytest.raises(PromptFileError, match=want):
        load_benchmarks(tmp_path)
