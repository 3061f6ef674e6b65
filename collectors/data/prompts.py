"""Question files in the EAGLE / Spec-Bench format, and prompt formatting.

Contract: a benchmark folder holds one subfolder per benchmark, each with a ``question.jsonl``
whose lines are JSON objects with ``question_id`` (int or str), ``category`` (str) and ``turns``
(a non-empty list of str); other keys are kept out of the way and ignored. Every problem in a
file raises :class:`PromptFileError` whose message starts with ``<file>:<line>:``. Formatting goes
through the template registry in ``decoder.models.templates``; this module knows no model and no token id
except in :func:`encode_prompts`, which takes any tokenizer with ``encode``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from decoder.models.templates import AUTO, ChatTokenizer, render_prompt

QUESTION_FILE = "question.jsonl"


class PromptFileError(ValueError):
    """A missing or malformed question file; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    """One benchmark question (possibly multi-turn)."""

    dataset: str
    question_id: int | str
    category: str
    turns: tuple[str, ...]


class Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def _parse_line(raw: str, where: str, dataset: str) -> Question:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("question_id", "category", "turns") if k not in obj]
    if missing:
        raise PromptFileError(f"{where}: missing key(s) {missing}")
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    if isinstance(qid, bool) or not isinstance(qid, int | str):
        raise PromptFileError(f"{where}: question_id must be an int or a string, got {qid!r}")
    if not isinstance(category, str):
        raise PromptFileError(f"{where}: category must be a string, got {category!r}")
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: turns must be a non-empty list of strings")
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise PromptFileError(f"{where}: every turn must be a non-empty string")
    return Question(dataset=dataset, question_id=qid, category=category, turns=tuple(turns))


def load_questions(path: Path | str, dataset: str | None = None) -> list[Question]:
    """Read one ``question.jsonl``; ``dataset`` defaults to the parent folder's name."""
    path = Path(path)
    name = dataset or path.parent.name
    if not path.is_file():
        raise PromptFileError(f"{path}:0: question file not found")
    questions: list[Question] = []
    seen: dict[int | str, int] = {}
    with path.open("rb") as fh:  # bytes, so a decoding error can name its line
        for lineno, data in enumerate(fh, start=1):
            try:
                raw = data.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                bad = f"byte {data[err.start]:#04x} at column {err.start + 1}"
                raise PromptFileError(f"{path}:{lineno}: not valid UTF-8 ({bad})") from None
            if not raw.strip():
                continue
            q = _parse_line(raw, f"{path}:{lineno}", name)
            if q.question_id in seen:
                raise PromptFileError(
                    f"{path}:{lineno}: duplicate question_id {q.question_id!r} "
                    f"(first on line {seen[q.question_id]})"
                )
            seen[q.question_id] = lineno
            questions.append(q)
    if not questions:
        raise PromptFileError(f"{path}:0: no questions in file")
    return questions


def load_benchmarks(root: Path | str, names: Sequence[str] | None = None) -> dict[str, list[Question]]:
    """Load ``root/<name>/question.jsonl`` for each name (default: every subfolder that has one)."""
    root = Path(root)
    if not root.is_dir():
        raise PromptFileError(f"{root}:0: benchmark folder not found")
    if names is None:
        names = sorted(p.parent.name for p in root.glob(f"*/{QUESTION_FILE}"))
        if not names:
            raise PromptFileError(f"{root}:0: no <benchmark>/{QUESTION_FILE} inside")
    return {name: load_questions(root / name / QUESTION_FILE, name) for name in names}


def write_questions(path: Path | str, questions: Iterable[Question]) -> int:
    """Write questions in the EAGLE format; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for q in questions:
            row = {"question_id": q.question_id, "category": q.category, "turns": list(q.turns)}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def format_prompt(
    question: Question, template: str, system: str | None = None, tokenizer: ChatTokenizer | None = None
) -> str:
    """The first turn of a question rendered with a registry template, or with the tokenizer's own
    for ``auto`` (paper: first turn only)."""
    return render_prompt(template, [question.turns[0]], tokenizer, system=system)


def encode_prompts(
    questions: Sequence[Question],
    tokenizer: Encoder,
    template: str,
    max_prompt_tokens: int,
) -> list[list[int]]:
    """Format and tokenize; over-long prompts keep their last ``max_prompt_tokens`` tokens.
    ``auto`` takes the chat template from ``tokenizer`` (decoder.models.templates.AUTO)."""
    chat = tokenizer if template == AUTO else None
    out = []
    for q in questions:
        ids = tokenizer.encode(format_prompt(q, template, tokenizer=chat), add_special_tokens=False)
        out.append(ids[-max_prompt_tokens:])
    return out


CATEGORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a category names a dataset folder


def split_by_category(path: Path | str, reserved: Collection[str] = ()) -> dict[str, list[Question]]:
    """A user's Spec-Bench ``question.jsonl`` (any path), validated, grouped by ``category``: each
    category becomes a dataset of that name, in first-seen order. A category that cannot name a
    folder, or that is ``reserved`` (the embedded datasets' names, ``corpus``), fails naming the
    first line that uses it."""
    path = Path(path)
    questions = load_questions(path, dataset="")
    first_line = _first_lines(path)
    groups: dict[str, list[Question]] = {}
    for q in questions:
        if q.category not in groups:
            where = f"{path}:{first_line[q.question_id]}"
            if not CATEGORY.fullmatch(q.category):
                raise PromptFileError(
                    f"{where}: category {q.category!r} must be letters, digits, '.', '_' or '-' "
                    "(it names the dataset's folder)"
                )
            if q.category in reserved:
                raise PromptFileError(
                    f"{where}: category {q.category!r} is taken by a built-in dataset; rename it"
                )
            groups[q.category] = []
        groups[q.category].append(dataclasses.replace(q, dataset=q.category))
    return groups


def _first_lines(path: Path) -> dict[int | str, int]:
    """question_id -> its line (the file already passed :func:`load_questions`)."""
    lines: dict[int | str, int] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if raw.strip():
            lines[json.loads(raw)["question_id"]] = lineno
    return lines
