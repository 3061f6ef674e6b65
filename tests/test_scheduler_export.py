"""Exported scheduler artifacts: round trip, refusals with clear errors, NumPy == torch == ONNX,
NumPy-only loading and deciding, and lossless decoding with the learned policies."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import noisy_copy, tiny_model

from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext
from decoder.core.state import state_feature_names
from decoder.deploy.planning import HEADS, suffix_feature_names
from decoder.deploy.scheduler import (
    LearnedScheduler,
    ManifestError,
    build_manifest,
    load_scheduler,
    load_value_planner,
    read_artifact,
    write_artifact,
)
from decoder.generate import generate
from decoder.models.pair import make_pair
from models.mlp import mlp_arrays
from models.onnx_export import head_to_onnx, run_onnx
from models.student import HEAD, Student
from models.value import ValueSystem

SIGNALS = ("frontier_mean_depth", "frontier_leaf_ratio", "preview_collapse_debt", "preview_history_share",
           "preview_overlap_ratio", "preview_mean_score")  # fmt: skip
NAMES = state_feature_names(5, SIGNALS)
RNG = np.random.default_rng(0)
X_MEAN, X_STD = RNG.normal(size=23), RNG.uniform(0.5, 2.0, size=23)


def student_artifact(path: Path, seed: int = 0, y_mean: float = 0.0, **over) -> tuple[Student, Path]:
    torch.manual_seed(seed)
    net = Student(17, (64, 32)).eval()
    fields = dict(
        kind="student", depth=5, width=10, feature_names=NAMES, input_names=NAMES, x_mean=X_MEAN[:17],
        x_std=X_STD[:17], heads={HEAD: net.sizes}, y_mean={HEAD: y_mean}, y_std={HEAD: 2.5},
    )  # fmt: skip
    fields.update(over)
    signals = list(fields["feature_names"][-len(SIGNALS) :])
    return net, write_artifact(path, build_manifest(**fields, signals=signals), mlp_arrays(HEAD, net.net))


def value_artifact(path: Path, seed: int = 1, a_invoke_mean: float = 2.0) -> tuple[ValueSystem, Path]:
    torch.manual_seed(seed)
    net = ValueSystem(23, (128, 64)).eval()
    arrays = {k: v for h in HEADS for k, v in mlp_arrays(h, net.heads[h]).items()}
    manifest = build_manifest(
        kind="value", depth=5, width=10, feature_names=NAMES, input_names=[*NAMES, *suffix_feature_names(5)],
        x_mean=X_MEAN, x_std=X_STD, heads={h: net.sizes for h in HEADS},
        y_mean={"A_invoke": a_invoke_mean, "logt_invoke": 3.6, "A_skip": 1.5, "logt_skip": 3.4},
        y_std={"A_invoke": 0.5, "logt_invoke": 0.2, "A_skip": 0.5, "logt_skip": 0.2},
    )  # fmt: skip
    return net, write_artifact(path, manifest, arrays)


def test_student_round_trip_numpy_equals_torch_and_onnx(tmp_path):
    net, path = student_artifact(tmp_path / "scheduler", y_mean=-0.35)  # mixed signs
    sched = load_scheduler(path, depth=5, width=10)
    z = RNG.normal(size=(50, 17)) * X_STD[:17] + X_MEAN[:17]
    with torch.no_grad():
        ref = net(torch.as_tensor((z - X_MEAN[:17]) / X_STD[:17], dtype=torch.float32)).double().numpy()[:, 0]
    ref = ref * 2.5 - 0.35
    got = np.array([sched.margin(r) for r in z])
    np.testing.assert_allclose(got, ref, atol=1e-5)
    clear = np.abs(ref) > 1e-3  # decisions compared where float32 rounding cannot flip the sign
    assert clear.sum() > 40 and 0 < (ref[clear] > 0).sum() < clear.sum()
    assert [sched.decide(r) for r in z[clear]] == list(ref[clear] > 0)
    art = read_artifact(path, "student")
    head_to_onnx(art.manifest, art.arrays, HEAD, tmp_path / "s.onnx")
    np.testing.assert_allclose(run_onnx(tmp_path / "s.onnx", z), got, atol=1e-4)


def hand_student(path: Path, **extra) -> Path:
    """A student written by hand: margin = y_std * (relu(u) - relu(-u)) + y_mean with
    u = (z0 - 1) / 2, i.e. 0.75 z0 - 3.75, zero at z0 = 5 (``extra``: more manifest fields)."""
    w0 = np.zeros((2, 17))
    w0[0, 0], w0[1, 0] = 1.0, -1.0
    arrays = {f"{HEAD}.0.weight": w0, f"{HEAD}.0.bias": np.zeros(2),
              f"{HEAD}.1.weight": np.array([[1.0, -1.0]]), f"{HEAD}.1.bias": np.zeros(1)}  # fmt: skip
    manifest = build_manifest(
        kind="student", depth=5, width=10, feature_names=NAMES, input_names=NAMES,
        x_mean=[1.0] + [0.0] * 16, x_std=[2.0] + [1.0] * 16, heads={HEAD: [17, 2, 1]},
        y_mean={HEAD: -3.0}, y_std={HEAD: 1.5}, signals=list(SIGNALS), **extra,
    )  # fmt: skip
    return write_artifact(path, manifest, arrays)


def test_hand_built_student_decides_where_its_formula_says(tmp_path):
    """margin = y_std * (relu(u) - relu(-u)) + y_mean with u = (z0 - 1) / 2: invoke iff z0 > 5."""
    sched = load_scheduler(hand_student(tmp_path / "hand"), 5, 10)
    z0 = np.array([-10.0, 0.0, 4.9, 5.1, 7.0, 100.0])
    z = np.zeros((len(z0), 17))
    z[:, 0] = z0
    z[:, 1:] = RNG.normal(size=(len(z0), 16)) * 50  # the other inputs have zero weight
    np.testing.assert_allclose([sched.margin(r) for r in z], 1.5 * (z0 - 1) / 2 - 3, atol=1e-9)
    assert [sched.decide(r) for r in z] == [False, False, False, True, True, True]


def test_value_planner_numpy_equals_torch(tmp_path):
    net, path = value_artifact(tmp_path / "value")
    planner = load_value_planner(path, depth=5)
    x = RNG.normal(size=(20, 23)) * X_STD + X_MEAN
    with torch.no_grad():
        ref = net(torch.as_tensor((x - X_MEAN) / X_STD, dtype=torch.float32)).double().numpy()
    art = read_artifact(path, "value")
    ref = ref * [art.manifest["y_std"][h] for h in HEADS] + [art.manifest["y_mean"][h] for h in HEADS]
    np.testing.assert_allclose(planner.predict(x), ref, atol=1e-5)


def test_mismatches_are_refused_with_clear_errors(tmp_path):
    _, path = student_artifact(tmp_path / "ok")
    with pytest.raises(ManifestError, match="D = 5 drafting steps, the decoder runs D = 4"):
        load_scheduler(path, depth=4)
    with pytest.raises(ManifestError, match="W = 10"):
        load_scheduler(path, width=8)
    swapped = (NAMES[1], NAMES[0], *NAMES[2:])
    _, bad = student_artifact(tmp_path / "order", feature_names=swapped, input_names=swapped)
    with pytest.raises(ManifestError, match="feature order"):
        load_scheduler(bad)
    unknown = (*NAMES[:-1], "mystery_signal")
    _, bad = student_artifact(tmp_path / "unknown", feature_names=unknown, input_names=unknown)
    with pytest.raises(ManifestError, match="not computed by this decoder"):
        load_scheduler(bad)
    with pytest.raises(ManifestError, match="field 'kind': 'student', expected 'value'"):
        load_value_planner(path)
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "schema_version": "treegraft-mlp/0"}))
    with pytest.raises(ManifestError, match="schema_version"):
        load_scheduler(path)
    path.write_text(json.dumps(meta))
    weights = path.with_suffix(".safetensors")
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x80\x3f")
    with pytest.raises(ManifestError, match="weights_sha256"):
        load_scheduler(path)


def test_loading_and_deciding_need_only_numpy_and_safetensors(tmp_path):
    _, path = student_artifact(tmp_path / "scheduler")
    code = f"""
import sys
for name in ("torch", "lightning", "sklearn", "transformers"):
    sys.modules[name] = None  # any import of these now fails
import numpy as np
from decoder.deploy.scheduler import LearnedScheduler, read_artifact
art = read_artifact({str(path)!r}, "student")
sched = LearnedScheduler(art, art.manifest["signals"])
print(sched.decide(np.zeros(17)), sched.margin(np.ones(17)))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr
    tree = ast.parse((Path(__file__).parents[1] / "decoder" / "deploy" / "scheduler.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m.split(".")[0] for m in imported} & {
        "torch",
        "pickle",
        "lightning",
        "sklearn",
        "json_tricks",
    }


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3", seed=71)
    return make_pair(target, noisy_copy(target, 0.3, seed=72), eos_token_ids=(0,))


def _median_shift(pair, prompt, config, runtime, path: Path) -> float:
    """-median of the student's raw margins on the states it meets, so its decisions are mixed."""
    probe, zs = load_scheduler(path), []

    def policy(ctx):
        zs.append(probe.features(ctx))
        return len(zs) % 2 == 0

    generate(pair, prompt, policy, config, runtime=runtime)
    return -float(np.median([probe.margin(z) for z in zs]))


def test_learned_policies_decode_losslessly(tmp_path, pair):
    prompt = [int(t) for t in np.random.default_rng(5).integers(1, 96, size=12)] * 2
    config = DecodeConfig(max_new_tokens=20)
    reference = generate(pair, prompt, "ar", config).new_tokens
    runtime = RuntimeContext(prompt_tokens=len(prompt), target_ms=12.0, mid_ms=3.0)
    _, s_path = student_artifact(tmp_path / "probe", seed=3)
    _, s_path = student_artifact(
        tmp_path / "scheduler", seed=3, y_mean=_median_shift(pair, prompt, config, runtime, s_path)
    )
    _, v_path = value_artifact(tmp_path / "value", a_invoke_mean=8.0)
    for policy in (load_scheduler(s_path, 5, 10), load_value_planner(v_path, 5, 10)):
        decisions = []

        def recording(ctx, policy=policy, decisions=decisions):
            decisions.append(policy(ctx))
            return decisions[-1]

        res = generate(pair, prompt, recording, config, runtime=runtime)
        assert res.new_tokens == reference
        assert len(decisions) == 5 * len(res.rounds) and any(decisions)
        if isinstance(policy, LearnedScheduler):
            assert not all(decisions)  # mixed invoke/skip rounds, all still lossless
    with pytest.raises(ValueError, match="needs the runtime context"):
        generate(pair, prompt, load_scheduler(s_path), config)
