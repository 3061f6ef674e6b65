"""The Ray backend of `collect` on a local two-node cluster: same files as the local backend, byte for
byte; the cluster is joined through `collect.ray.address` only (RAY_ADDRESS alone starts a local
instance); pair actors of a bare `cuda` device take the driver's GPUs round-robin. The tests on the
cluster start its nodes as processes: `slow`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
from collect_workspace import write_questions
from conftest import save_pair, train_tokenizer
from ray import cluster_utils

from collectors.collect import ray_backend, report
from collectors.collect.ray_backend import connect, disconnect, read_folder, write_folder
from collectors.collect.report import write_report
from config.params import RayParams, load_params
from pipeline import collect
from pipeline.cli import stage_params

PAIRS = {"tiny": 61, "tiny-b": 91}  # two pairs: two actors, one per node of the cluster
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Question files, two saved pairs sharing a trained tokenizer, and their latency profiles."""
    root = tmp_path_factory.mktemp("ray")
    texts = write_questions(root)
    tok = train_tokenizer(texts, vocab=300)
    for pair, seed in PAIRS.items():
        save_pair(root / pair, tok, seed=seed)
    from pipeline.profile import main as profile_main

    profile_main(stage_params("profile", params_for(root, "unused")))
    return root


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node of one CPU each, in subprocesses of this test only."""
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    try:
        yield c
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def params_for(root: Path, name: str, **collect_overrides):
    pairs = {
        p: {"target": str(root / p / "target"), "mid": str(root / p / "mid"), "dtype": "float32",
            "device": "cpu", "template": "zoo", "linear": "stock"}
        for p in PAIRS
    }  # fmt: skip
    return load_params(
        profile="smoke",
        overrides={
            "mlflow": {"db": str(root / "mlflow.db")},
            "data": {"out_dir": str(root / "data")},
            "pairs": pairs,
            "profile": {"pairs": list(PAIRS), "out_dir": str(root / "profile"), "sizes": [1, 16, 64, 160]},
            "budget": {"mode": "fixed", "out_dir": str(root / "budget")},
            "collect": {"out_dir": str(root / name), "pairs": list(PAIRS), "datasets": ["code", "chat"],
                        "prompts_per_report": 2, "max_new_tokens": 12, **collect_overrides},
            "runtime": {"torch_threads": 1},
        },
    )  # fmt: skip


def files(out: Path) -> dict[str, bytes]:
    """Every Parquet file of a collect output folder (reports and merged tables), by relative path."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.parquet"))}


@pytest.mark.slow
def test_ray_on_a_two_node_cluster_writes_the_local_backends_files(workspace, cluster, monkeypatch):
    local = params_for(workspace, "local")
    remote = params_for(workspace, "ray", backend="ray", ray={"address": cluster.address})
    want = collect.main(stage_params("collect", local))
    written = []

    def driver_writes(out_dir, spec, *args):
        written.append(spec.report_id)
        return write_report(out_dir, spec, *args)

    monkeypatch.setattr(ray_backend, "write_report", driver_writes)  # seen by the driver only
    got = collect.main(stage_params("collect", remote))
    assert not ray.is_initialized()  # the backend disconnects what it connected
    assert sorted(written) == sorted(f"{p}__{d}__0-2" for p in PAIRS for d in ("code", "chat"))
    a, b = files(Path(local.collect.out_dir)), files(Path(remote.collect.out_dir))
    n = len(report.TABLE_NAMES)  # merged, and per report
    assert len(a) == n + n * len(PAIRS) * 2 and sorted(a) == sorted(b)
    assert all(a[name] == b[name] for name in a), [n for n in a if a[n] != b[n]]
    assert got == want and want["n_reports"] == 4
    summary = (Path(remote.collect.out_dir) / "summary.md").read_text()
    assert summary == (Path(local.collect.out_dir) / "summary.md").read_text()
    assert sorted(p.name for p in (Path(remote.collect.out_dir) / "reports").iterdir()) == sorted(
        f"{p}__{d}__0-2" for p in PAIRS for d in ("code", "chat")
    )


@pytest.mark.slow
def test_only_the_param_joins_a_cluster(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # the param wins over the environment
    assert connect(RayParams(address=cluster.address, num_cpus=2, gpus_per_task=0.0))
    try:
        assert ray.get_runtime_context().gcs_address == cluster.gcs_address
        assert ray.cluster_resources()["CPU"] == 2  # both nodes, not a fresh local instance
    finally:
        ray.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # not joined without collect.ray.address
    before = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    assert connect(RayParams(address="", num_cpus=1, gpus_per_task=0.0))
    try:
        assert ray.get_runtime_context().gcs_address != cluster.gcs_address
        assert ray.cluster_resources()["CPU"] == 1
        assert os.environ["RAY_AUTH_MODE"] == "token"  # a local instance keeps token auth
    finally:
        disconnect()
    assert {k: os.environ.get(k) for k in before} == before  # the cluster's auth again, for a next join
    assert connect(RayParams(address=cluster.address, num_cpus=2, gpus_per_task=0.0))
    try:
        assert ray.get([ray.remote(lambda: 1).remote()]) == [1]  # its workers can call this driver
    finally:
        disconnect()


def test_actors_of_cuda_pairs_take_the_drivers_gpus_round_robin(tmp_path, monkeypatch):
    params = params_for(tmp_path, "unused")
    pairs = {p: spec.model_copy(update={"device": "cuda"}) for p, spec in params.pairs.items()}
    params = params.model_copy(update={"pairs": {**pairs, "cpu-pair": params.pairs["tiny"]}})
    ids, devices = ["tiny", "cpu-pair", "tiny-b"], ray_backend.actor_devices
    monkeypatch.setattr(ray_backend, "cuda_device_count", lambda: 2)
    assert devices(params, ids, 0.0) == {"tiny": "cuda:0", "cpu-pair": None, "tiny-b": "cuda:1"}
    monkeypatch.setattr(ray_backend, "cuda_device_count", lambda: 1)
    assert devices(params, ids, 0.0) == {"tiny": "cuda:0", "cpu-pair": None, "tiny-b": "cuda:0"}
    assert devices(params, ids, 1.0) == dict.fromkeys(ids)  # Ray shows each actor only its own GPUs
    monkeypatch.setattr(ray_backend, "cuda_device_count", lambda: 0)
    with pytest.raises(ValueError, match="gpus_per_task"):
        devices(params, ids, 0.0)


def test_checkpoint_folders_travel_as_bytes(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 3)
    copy = write_folder(read_folder(src), tmp_path / "copy")
    assert read_folder(copy) == read_folder(src) and sorted(read_folder(src)) == [
        "config.json",
        "sub/weights.bin",
    ]
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        read_folder(tmp_path / "missing")
