"""params.yaml -> frozen typed dataclasses; the only home of defaults.

The bottom layer: imports nothing of the project (see the README's architecture section).

Contract: :func:`load_params` reads ``params.yaml``, deep-merges its overlay
``profiles/<name>.yaml`` on top (mappings merge key by key, anything else is replaced), and builds
:class:`Params`. Unknown keys, missing keys and wrong types raise :class:`ParamsError` naming the
dotted key. A later stage adds a section by writing one frozen dataclass and adding one field to
:class:`Params` (and the section to params.yaml); the generic parser needs no change.

Profiles: ``base`` (no changes, the default), ``smoke`` (tiny sizes for tests and CI) and
``real-pair`` (opt-in real checkpoint pair). params.yaml's ``overlay`` key selects one, so DVC sees
the choice: ``dvc exp run -S overlay=smoke``. ``--profile`` on a stage CLI overrides it for a run
outside DVC.

:func:`restrict` gives a stage only the sections its dvc.yaml entry lists: reading any other
section raises, so a stage cannot depend on a param DVC does not track.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parent.parent
OVERLAY_KEY = "overlay"  # params.yaml names its overlay profiles/<overlay>.yaml (DVC tracks both)
T = TypeVar("T")


class ParamsError(ValueError):
    """params.yaml (or a profile) does not match the declared sections."""


@dataclass(frozen=True)
class TrainConfig:
    """Minibatch training settings of a small regressor (see models.training.fit_regressor)."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    seed: int


@dataclass(frozen=True)
class PinnedPackage:
    """A registry file pinned twice: ``name==version`` and the SHA-256 of the downloaded file."""

    requirement: str
    sha256: str


@dataclass(frozen=True)
class DataParams:
    out_dir: str
    seed: int
    n_questions: int
    datasets: tuple[str, ...]
    stdlib_corpus_chars: int
    template: str
    packages: dict[str, PinnedPackage]  # collectors/embedded_data.py SOURCES key -> pin


@dataclass(frozen=True)
class TokenizerParams:
    vocab_size: int
    min_frequency: int
    max_chars: int


@dataclass(frozen=True)
class TrainParams:
    seq_len: int
    batch_size: int
    lr: float
    warmup_steps: int
    threads: int
    corpus_chars: int


@dataclass(frozen=True)
class ModelSpec:
    """One zoo model. A mid drafter names its ``teacher`` target; a target leaves it empty.

    ``init_from`` names a trained zoo model of the same width to grow from (progressive
    stacking, see models/lm_training.grow_model; same depth = fine-tune a copy); empty means
    random initialisation. ``corpus`` names the corpus files (``<data>/corpus/<name>.jsonl``) the
    model trains and distills on; empty means all of them.
    """

    arch: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn: int
    steps: int
    teacher: str
    init_from: str
    distill_prompts: int
    distill_new_tokens: int
    corpus: tuple[str, ...]


@dataclass(frozen=True)
class BlockDrafterSpec:
    """One zoo block drafter (decoder/block_drafter.py) for the zoo target ``target``.

    It reads ``target_layers`` hidden states of the target (evenly spread over its depth) at the last
    ``context`` positions and predicts ``k`` positions per forward. It trains ``steps`` steps on
    ``sequences`` sequences (half the target's greedy continuations of ``new_tokens`` tokens, half
    ``corpus`` windows; the last ``held_out`` are held out), loss weights exp(-(k-1) / gamma).
    """

    target: str
    corpus: tuple[str, ...]
    k: int
    target_layers: int
    context: int
    layers: int
    d_model: int
    heads: int
    ffn: int
    steps: int
    batch_size: int
    lr: float
    gamma: float
    sequences: int
    new_tokens: int
    held_out: int


@dataclass(frozen=True)
class ZooParams:
    out_dir: str
    seed: int
    template: str
    tokenizer: TokenizerParams
    train: TrainParams
    models: dict[str, ModelSpec]
    block_drafters: dict[str, BlockDrafterSpec]


@dataclass(frozen=True)
class PairSpec:
    """A target/mid pair by local path; ``{zoo}`` in a path means ``zoo.out_dir``."""

    target: str
    mid: str
    dtype: str
    device: str
    template: str
    linear: str  # the models' nn.Linear kernel: decoder.models.LINEAR_KERNELS


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF file split over registry packages (see models/real_pair.py), each wheel pinned."""

    packages: tuple[PinnedPackage, ...]
    sha256: str
    out: str


@dataclass(frozen=True)
class RealPairParams:
    target: ChunkedModel
    mid: ChunkedModel
    dtype: str


@dataclass(frozen=True)
class TreeParams:
    """Draft-tree settings shared by every stage that decodes (fields of decoder.config.TreeConfig)."""

    depth: int
    width: int
    topk: int
    budget: int
    extended_grafting: bool
    grafting: str
    ngram_max_n: int
    ngram_max_matches: int
    ngram_chain_len: int
    ngram_min_n: int
    sequential: bool


@dataclass(frozen=True)
class ProfileParams:
    """The ``profile`` stage: one latency profile per pair (see collectors/latency.py)."""

    pairs: tuple[str, ...]
    out_dir: str
    context_len: int
    warmup: int  # discarded repeats
    repeats: int  # kept repeats: a figure is the median of per-repeat medians
    samples_per_repeat: int  # round-robin passes over every component within one repeat
    sizes: tuple[int, ...]  # tree nodes for verify (up to budget + 1) and for the per-round tree work
    mid_tokens: tuple[int, ...]  # mid-call table: tokens one call forwards
    mid_fed: tuple[int, ...]  # mid-call table: tree nodes already fed this round (0 included)
    # whole measurements of every pair, the pairs in turn; a figure is their median (a slow spell
    # of the machine hits one pass of a pair and is outvoted)
    passes: int = 1
    # a job whose run takes at least this many ms (in the first repeat) is sampled once per repeat
    # instead of samples_per_repeat times (0: never)
    long_job_ms: float = 0.0


@dataclass(frozen=True)
class BudgetParams:
    """The ``budget`` stage: each pair's verification budget, measured on the collect prompt slice."""

    out_dir: str
    mode: str  # measured (the sweep picks B) | fixed (every pair gets tree.budget, nothing measured)
    datasets: tuple[str, ...]  # prompts taken in turn from these
    prompts_per_pair: int  # from collect.prompt_start on, never reaching evaluate.prompt_start
    max_new_tokens: int
    # (width, topk) tree shapes swept besides B; the best one priced wins. Empty: the tree section's
    # own width and topk only (one sweep per shape: each costs a replay of every prompt).
    shapes: tuple[tuple[int, ...], ...]
    # mixed fixed schedules (bit strings, e.g. "10101") swept beside All-Small and All-Mid
    schedules: tuple[str, ...]
    # per-round budget rule (decoder/budget.py verify_budget): multipliers of the gain scale fitted
    # on the sweep's rounds (collectors/budget_sweep.py gain_scale) tried; [] = off
    round_gain_scales: tuple[float, ...] = ()
    # the rule replaces the fixed budget only when it prices at least this much faster (0.02 = 2%)
    round_min_gain: float = 0.02


@dataclass(frozen=True)
class RayParams:
    """``collect.backend: ray``: ``address`` joins a running cluster ("" = the RAY_ADDRESS environment
    variable if set, else a local instance of ``num_cpus`` CPUs); GPUs reserved per pair actor."""

    address: str
    num_cpus: int
    gpus_per_task: float


@dataclass(frozen=True)
class CollectParams:
    """The ``collect`` stage: every 2^D schedule per report (pair x dataset x prompt slice)."""

    out_dir: str
    mode: str  # replay | execute
    backend: str  # local | ray
    pairs: tuple[str, ...]
    datasets: tuple[str, ...]
    prompt_start: int
    prompts_per_report: int
    max_new_tokens: int
    max_prompt_tokens: int
    seed: int
    round_table_stride: int  # replay: all 2^D schedules at every k-th visited round start (0: none)
    workers: int  # local backend: processes collecting reports side by side (1: in this process)
    ray: RayParams


@dataclass(frozen=True)
class MlflowParams:
    """Local MLflow tracking: ``db`` is a SQLite file (relative to the repo), one run per stage."""

    db: str
    experiment: str


@dataclass(frozen=True)
class CanonicalizeParams:
    out_dir: str
    n_folds: int


@dataclass(frozen=True)
class SelectSignalsParams:
    out_dir: str
    n_signals: int  # size of the chosen subset
    sizes: tuple[int, ...]  # subset sizes evaluated and logged (must include n_signals)
    ridge_alpha: float


@dataclass(frozen=True)
class FitValueParams:
    out_dir: str
    hidden: tuple[int, ...]
    train: TrainConfig


@dataclass(frozen=True)
class MarginsParams:
    out_dir: str


@dataclass(frozen=True)
class DistillParams:
    out_dir: str
    margin_source: str  # value | oracle
    relative: bool  # margin / better branch's tokens/s, so reports of different speed weigh alike
    hidden: tuple[int, ...]
    train: TrainConfig
    loss: str  # mse | weighted_mse | weighted_logistic (models/student.py)
    skip_tolerance_pct: float  # threshold: the largest within this many % points of the best
    threshold_rule: str  # walked (mean walked % of best) | state (mean per-state regret)
    train_set: str  # auto | canonical | rounds | both (auto: the best out of fold is exported)


@dataclass(frozen=True)
class ExportParams:
    out_dir: str
    bench_decisions: int


@dataclass(frozen=True)
class AblationParams:
    """Component ablations under the fixed schedule (paper: 10101)."""

    schedule: str
    pairs: tuple[str, ...]
    datasets: tuple[str, ...]


@dataclass(frozen=True)
class EvaluateParams:
    """The ``evaluate`` stage: every method priced by replay on held-back prompts (the primary
    metric), a few methods also decoded for real (wall clock, lossless gate); fitting and held-out
    rows."""

    out_dir: str
    pairs: tuple[str, ...]
    datasets: tuple[str, ...]
    held_out_pairs: tuple[str, ...]  # never used by collect (and so never by fitting)
    held_out_datasets: tuple[str, ...]
    prompt_start: int  # after the collect slice, so no evaluation prompt was seen in fitting
    prompts_per_cell: int  # priced by replay (exact counts x the latency profile)
    wall_prompts_per_cell: int  # the first of them, also decoded for real and timed
    wall_methods: tuple[str, ...]  # methods decoded for real (autoregressive always is)
    wall_min_ar_s: float  # each wall prompt timed until AR's runs of it last this long ...
    wall_max_repeats: int  # ... at most this many times; every method keeps its median run
    bootstrap: int  # resamples over prompts for the 95% intervals
    max_new_tokens: int
    workers: int  # processes for the priced replay (1: in this process); wall clock runs alone
    ablation: AblationParams


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
    pairs: tuple[str, ...]
    drafters: tuple[str, ...]
    datasets: tuple[str, ...]
    prompts_per_dataset: int
    max_new_tokens: int
    budget: int  # DDTree nodes per recorded round
    topk: int  # candidates per position
    proj: int
    depth_dim: int
    hidden: int
    lambda_kl: float
    lambda_pair: float
    lambda_bce: float
    pair_margin: float
    w1: float
    epochs: int
    lr: float
    weight_decay: float
    seed: int
    n_folds: int
    eval_budgets: tuple[int, ...]  # A at equal budget is replayed at each of these


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
    prompts_per_cell: int
    wall_prompts_per_cell: int  # the first of them, every row also decoded for real and timed
    max_new_tokens: int
    budget_max: int
    choice_prompts_per_dataset: int
    rule_caps: tuple[int, ...]
    rule_l2: float
    cost_sizes: tuple[int, ...]
    warmup: int
    repeats: int
    passes: int


@dataclass(frozen=True)
class RuntimeParams:
    """How the decoding stages (profile, collect, evaluate) use the machine."""

    torch_threads: int  # 1 keeps timings stable on a shared 2-core machine
    keep_freed_memory: bool  # glibc keeps freed memory (decoder/memory.py): no page faults in rounds


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
    evaluate: EvaluateParams
    runtime: RuntimeParams
    edges: EdgesParams
    graft_eval: GraftEvalParams

    def pair_paths(self, name: str) -> tuple[Path, Path]:
        """Resolved (target, mid) paths of a registered pair."""
        if name not in self.pairs:
            raise KeyError(f"unknown pair {name!r}; known: {sorted(self.pairs)}")
        spec = self.pairs[name]
        zoo = str(resolve(self.zoo.out_dir))
        return resolve(spec.target.format(zoo=zoo)), resolve(spec.mid.format(zoo=zoo))


def resolve(path: str) -> Path:
    """Relative paths in params are relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def _parse(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, where)
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ParamsError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _parse(val_tp, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{where}: expected a list, got {value!r}")
        return tuple(_parse(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ParamsError(f"{where}: union types are not supported in params")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ParamsError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def parse_section(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown and missing keys."""
    if not isinstance(data, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown:
        raise ParamsError(f"{where}: unknown key(s) {unknown}")
    if missing:
        raise ParamsError(f"{where}: missing key(s) {missing}")
    return cls(**{n: _parse(hints[n], data[n], f"{where}.{n}") for n in names})


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
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    name = profile if profile is not None else raw.get(OVERLAY_KEY)
    if not isinstance(name, str) or not name:
        raise ParamsError(f"{path}: {OVERLAY_KEY!r} must name a file in profiles/, got {name!r}")
    overlay_path = path.parent / "profiles" / f"{name}.yaml"
    if not overlay_path.is_file():
        raise ParamsError(f"profile {name!r}: {overlay_path} not found")
    overlay = yaml.safe_load(overlay_path.read_text(encoding="utf-8")) or {}
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
