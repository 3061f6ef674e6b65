"""params.yaml and its profiles parse into frozen pydantic models; unknown or missing keys fail."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from config.params import ROOT, Params, ParamsError, deep_merge, load_params, load_raw, restrict


@pytest.mark.parametrize("profile", [None, "smoke", "real-pair"])
def test_every_profile_parses(profile: str | None) -> None:
    params = load_params(profile=profile)
    assert isinstance(params, Params)
    with pytest.raises(ValidationError, match="frozen"):
        params.data.seed = 1  # type: ignore[misc]
    for name in params.pairs:
        target, mid = params.pair_paths(name)
        assert target.is_absolute() and mid.is_absolute()


def test_zoo_has_required_shape() -> None:
    zoo = load_params().zoo
    targets = [n for n, s in zoo.models.items() if not s.teacher]
    mids = [n for n, s in zoo.models.items() if s.teacher]
    assert len(targets) >= 2 and len(mids) >= 3
    assert all(zoo.models[m].teacher in targets for m in mids)


def test_smoke_profile_shrinks_and_moves_outputs() -> None:
    base, smoke = load_params(), load_params(profile="smoke")
    assert smoke.zoo.out_dir != base.zoo.out_dir and smoke.data.out_dir != base.data.out_dir
    assert set(smoke.zoo.models) == set(base.zoo.models)
    assert all(smoke.zoo.models[n].steps <= base.zoo.models[n].steps for n in base.zoo.models)
    assert sum(s.steps for s in smoke.zoo.models.values()) < 100
    assert smoke.pairs.keys() == base.pairs.keys()


def test_real_pair_profile_trains_the_bf16_pair_on_its_own_reports() -> None:
    """The overlay registers the pair in bf16 and fp32 and runs every scheduler stage on bf16: 5
    categories x 4 collect prompts, 6 evaluated datasets (pydoc held out), its own student (no
    held-out pair), batched replay; the GRAFT stages keep the zoo pairs they price."""
    real = load_params(profile="real-pair")
    extra = set(real.pairs) - set(load_params().pairs)
    assert extra == {"qwen2.5-coder-1.5b-0.5b", "qwen2.5-coder-1.5b-0.5b-fp32"}
    assert {real.pairs[p].dtype for p in extra} == {"bfloat16", "float32"}
    assert all(real.pairs[p].template == "chatml" for p in extra)
    bf16 = ("qwen2.5-coder-1.5b-0.5b",)
    assert real.collect.pairs == real.evaluate.pairs == bf16 and real.evaluate.held_out_pairs == ()
    assert len(real.collect.datasets) >= 5 and real.collect.prompts_per_report >= 4
    assert len(real.evaluate.datasets) == 6 and real.evaluate.prompts_per_cell >= 3
    fp32 = ("qwen2.5-coder-1.5b-0.5b-fp32",)  # priced by the budget stage only
    assert real.budget.extra_pairs == fp32 and real.runtime.replay_batch_rows > 0
    assert set(real.profile.pairs) == {*bf16, *fp32, *real.edges.pairs}


def _write_params(tmp_path: Path, mutate) -> Path:
    raw = load_raw()
    mutate(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    (tmp_path / "profiles").mkdir(exist_ok=True)
    for overlay in (ROOT / "profiles").glob("*.yaml"):
        (tmp_path / "profiles" / overlay.name).write_text(overlay.read_text())
    return path


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    path = _write_params(tmp_path, lambda r: r["zoo"]["train"].update(lr_typo=1.0))
    with pytest.raises(ParamsError, match=r"params\.zoo\.train\.lr_typo: Extra inputs are not permitted"):
        load_params(path)


def test_missing_key_is_rejected(tmp_path: Path) -> None:
    path = _write_params(tmp_path, lambda r: r["data"].pop("seed"))
    with pytest.raises(ParamsError, match=r"params\.data\.seed: Field required"):
        load_params(path)


def test_wrong_type_is_rejected(tmp_path: Path) -> None:
    path = _write_params(tmp_path, lambda r: r["zoo"]["models"]["mid-s"].update(layers="two"))
    with pytest.raises(
        ParamsError, match=r"params\.zoo\.models\.mid-s\.layers: Input should be a valid integer"
    ):
        load_params(path)
    path = _write_params(tmp_path, lambda r: r["data"].update(seed=True))
    with pytest.raises(ParamsError, match=r"params\.data\.seed: Input should be a valid integer, got True"):
        load_params(path)


def test_unknown_section_and_profile(tmp_path: Path) -> None:
    path = _write_params(tmp_path, lambda r: r.update(surprise={}))
    with pytest.raises(ParamsError, match=r"params\.surprise: Extra inputs are not permitted"):
        load_params(path)
    with pytest.raises(ParamsError, match="profile 'nope'"):
        load_params(profile="nope")


def test_deep_merge_and_overrides() -> None:
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 3}, "d": [2]}) == {
        "a": {"b": 3, "c": 2},
        "d": [2],
    }
    elsewhere = Path(tempfile.gettempdir()) / "elsewhere"  # outputs may go to the temp folder
    params = load_params(overrides={"zoo": {"out_dir": str(elsewhere)}})
    assert params.pair_paths("zoo-s")[0] == elsewhere / "target-s"
    with pytest.raises(KeyError, match="unknown pair"):
        params.pair_paths("nope")


def test_params_yaml_names_its_overlay_and_a_run_can_override_it(tmp_path: Path) -> None:
    assert load_params().overlay == "base"
    path = _write_params(tmp_path, lambda r: r.update(overlay="smoke"))
    from_file = load_params(path)
    assert from_file.overlay == "smoke"
    assert from_file.zoo == load_params(profile="smoke").zoo
    assert load_params(path, profile="base").zoo == load_params().zoo


def test_an_overlay_cannot_name_another_overlay(tmp_path: Path) -> None:
    path = _write_params(tmp_path, lambda r: None)
    (tmp_path / "profiles" / "loop.yaml").write_text("overlay: smoke\n")
    with pytest.raises(ParamsError, match="cannot set 'overlay'"):
        load_params(path, profile="loop")


def test_restrict_hides_undeclared_sections() -> None:
    params = restrict(load_params(), "margins", {"tree", "margins"})
    assert params.tree.depth == 5 and params.margins.out_dir
    assert params.mlflow.experiment and params.overlay == "base"  # bookkeeping, always readable
    with pytest.raises(ParamsError, match=r"stage 'margins' reads params\.collect\.seed.*dvc\.yaml"):
        _ = params.collect.seed
    with pytest.raises(ParamsError, match="unknown params section"):
        restrict(load_params(), "margins", {"marginz"})


def test_restrict_exposes_only_the_declared_keys_of_a_section() -> None:
    params = restrict(load_params(), "canonicalize", ["canonicalize", "collect.out_dir", "tree.depth"])
    assert params.collect.out_dir == load_params().collect.out_dir and params.tree.depth == 5
    with pytest.raises(ParamsError, match=r"params\.collect\.seed"):
        _ = params.collect.seed
    with pytest.raises(ParamsError, match=r"unknown params key 'tree\.nope'"):
        restrict(load_params(), "canonicalize", ["tree.nope"])


def test_a_restricted_params_object_survives_pickling() -> None:
    """Ray ships params to workers by pickle: the stand-ins must round-trip and keep refusing."""
    import pickle

    params = pickle.loads(pickle.dumps(restrict(load_params(), "canonicalize", ["collect.out_dir"])))
    assert params.collect.out_dir == load_params().collect.out_dir
    with pytest.raises(ParamsError, match=r"params\.collect\.seed"):
        _ = params.collect.seed
