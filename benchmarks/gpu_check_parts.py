"""Pieces of the one-command device check (benchmarks/gpu_check.py): the zoo it runs on, its prompts,
the policies it decodes with, and how a decode is priced against its clock.

The zoo is ``artifacts/zoo`` when a full run built it, else the smoke zoo trained here on a corpus
cut from this Python's standard library (no network: the data stage's downloads are not needed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.data.embedded_data import stdlib_files
from config.params import Params, ZooParams, load_params, resolve
from decoder.core.outcome import GenerationResult
from decoder.core.policies import RuntimeContext
from decoder.deploy.latency import LatencyProfile, counts_from_round, price_ar, price_round
from decoder.graft.block import BlockProposer
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.templates import get_template, render

log = logging.getLogger(__name__)

FULL_ZOO = "artifacts/zoo"
# The smoke zoo's chat models and the chat target's block drafter learn from the chat file only.
CHAT_ONLY = {
    "models": {n: {"corpus": ["chat"]} for n in ("target-chat", "mid-chat")},
    "block_drafters": {"block-chat-l": {"corpus": ["chat"]}},
}


def write_stdlib_corpus(data_dir: Path, n_files: int = 40) -> None:
    """``data_dir/corpus/{code,chat}.jsonl``: stdlib source, and chat turns asking about a module
    answered with its opening lines (the chat template's prompts then occur in training)."""
    corpus = data_dir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    files = stdlib_files()[:n_files]
    code = [p.read_text(encoding="utf-8", errors="replace")[:4000] for p in files]
    eos = get_template("zoo").eos_text
    chats = [
        render("zoo", [f"Explain the module {p.stem}."]) + t[:400] + eos
        for p, t in zip(files, code, strict=True)
    ]
    for name, docs in (("code", code), ("chat", chats)):
        (corpus / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8"
        )


def zoo_subset(params: Params, pairs: list[str]) -> ZooParams:
    """The zoo section cut to what ``pairs`` decode with: their targets and mid drafters, the
    models those are distilled or grown from, and the pairs' block drafters (edges.drafters)."""
    wanted = {Path(spec).name for p in pairs for spec in (params.pairs[p].target, params.pairs[p].mid)}
    drafters = {d for p, d in zip(params.edges.pairs, params.edges.drafters, strict=True) if p in pairs}
    wanted |= {params.zoo.block_drafters[d].target for d in drafters}
    todo = list(wanted)
    while todo:
        spec = params.zoo.models[todo.pop()]
        for dep in (spec.teacher, spec.init_from):
            if dep and dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    models = {n: s for n, s in params.zoo.models.items() if n in wanted}
    blocks = {n: s for n, s in params.zoo.block_drafters.items() if n in drafters}
    return params.zoo.model_copy(update={"models": models, "block_drafters": blocks})


def zoo_params(
    work: Path, zoo: Path | None, pairs: list[str] | None, train: bool = False
) -> tuple[Params, bool]:
    """Params whose pairs point at a trained zoo, and whether it is a full one: ``zoo`` if given,
    else artifacts/zoo when it holds zoo.json, else the smoke zoo's models that ``pairs`` (default
    edges.pairs) need, trained under ``work`` (always, with ``train``)."""
    from models.zoo import train_zoo  # heavy (training code) only when a zoo is trained here

    full = resolve(FULL_ZOO)
    if zoo is None and not train and (full / "zoo.json").is_file():
        return load_params(), True
    if zoo is not None and not train:
        return load_params(overrides={"zoo": {"out_dir": str(zoo)}}), True
    params = load_params(profile="smoke", overrides={"zoo": {**CHAT_ONLY, "out_dir": str(work / "zoo")}})
    unknown = sorted(set(pairs or ()) - set(params.pairs))
    if unknown:
        raise ValueError(f"--pairs: unknown pair(s) {unknown}; known: {sorted(params.pairs)}")
    write_stdlib_corpus(work / "data")
    log.info("training the smoke zoo into %s", work / "zoo")
    train_zoo(zoo_subset(params, pairs or list(params.edges.pairs)), work / "data", work / "zoo")
    return params, False


def check_prompts(
    params: Params, pair_id: str, tokenizer: object, n: int, max_tokens: int
) -> list[list[int]]:
    """n prompt token lists: the data stage's questions when it has run, else chat turns asking
    about stdlib modules, rendered with the pair's template."""
    from collectors.data.prompts import encode_prompts, load_benchmarks

    template = params.pairs[pair_id].template
    root = resolve(params.data.out_dir)
    if root.is_dir():
        try:
            benches = load_benchmarks(root, list(params.data.datasets))
            questions = [qs[i] for i in range(n) for qs in benches.values() if i < len(qs)][:n]
            if len(questions) == n:
                return encode_prompts(questions, tokenizer, template, max_tokens)
        except (OSError, ValueError) as err:
            log.info("no data-stage prompts (%s): stdlib chat prompts instead", err)
    stems = [p.stem for p in stdlib_files()[-n:]]
    texts = [render(template, [f"Explain the module {s}."]) for s in stems]
    return [tokenizer.encode(t, add_special_tokens=False)[-max_tokens:] for t in texts]  # type: ignore[attr-defined]


@dataclass
class Method:
    """One row of a pair's table: a policy and what ``generate`` needs besides it, or the reason it
    cannot run (``missing``) or the note qualifying it."""

    name: str
    policy: Any = None
    proposer: BlockProposer | None = None
    edge_scorer: EdgeScorer | None = None
    tree: Any = None  # a TreeConfig (the deployment's) in place of the check's
    runtime_of: Callable[[int], RuntimeContext] | None = None  # prompt length -> runtime context
    missing: str = ""
    note: str = ""


def deployed_method(deployment: Path | None, pair_id: str) -> Method:
    """The deployed scheduler from a bundle (``--deployment``, else artifacts/deploy), or a row
    saying why none is available."""
    path = deployment if deployment is not None else resolve("artifacts/deploy")
    try:
        from decoder import load_deployment
    except ImportError as err:
        return Method("deployed", missing=f"decoder.load_deployment not importable ({err})")
    if not path.exists():
        return Method("deployed", missing=f"no deployment bundle at {path}")
    try:
        d = load_deployment(path, pair_id)
    except (ValueError, OSError) as err:
        return Method("deployed", missing=f"bundle {path} has no usable {pair_id} deployment ({err})")
    name = "learned scheduler" if d.is_learned else f"fallback {d.policy}"
    return Method(
        "deployed", d.policy, tree=d.config.tree, runtime_of=d.runtime, note=f"{name} from {d.folder}"
    )


def priced_over_measured(profile: LatencyProfile, results: list[GenerationResult], is_ar: bool) -> float:
    """Modelled ms of the decodes over their measured wall time, prefill excluded from both: AR
    priced by its per-token step, a tree policy by price_round of each round's counts. Wall time,
    not the rounds' component clocks: the check decodes with timing=False (no per-step syncs), and
    a speedup is a ratio of wall times, so this says how far a priced speedup is from a real one."""
    measured = sum(1e3 * (r.wall_s - r.prefill_s) for r in results)
    if is_ar:
        priced = sum(price_ar(profile, r.decoded_tokens) for r in results)
    else:
        priced = sum(price_round(profile, counts_from_round(rd)) for r in results for rd in r.rounds)
    return priced / measured if measured > 0 else float("nan")
