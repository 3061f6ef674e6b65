"""Devices: a CUDA device asked for on a CPU-only torch is one error naming the params key; pool
workers each take their own GPU (cuda:i round-robin, one worker per visible device) with the device
count stood in for; CPU workers are as before; decoder.models.memory.configure_process is the one setup."""

from __future__ import annotations

import logging
import multiprocessing
import os

import pytest
import torch

from collectors.collect import pool
from collectors.collect.pool import Task, run_tasks, worker_device
from config.params import load_params
from decoder.models import devices, memory
from decoder.models.devices import require_device, worker_devices
from pipeline.runtime import apply_runtime

cpu_only = pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")


def test_cuda_round_robins_over_the_visible_devices() -> None:
    assert worker_devices("cuda", 4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]  # one per device
    assert worker_devices("cuda", 4, 2) == ["cuda:0", "cuda:1"]
    assert worker_devices("cuda", 2, 5) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert worker_devices("cpu", 4, 3) == ["cpu"] * 3  # a CPU and an explicit device are shared as given
    assert worker_devices("cuda:1", 4, 2) == ["cuda:1", "cuda:1"]
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        worker_devices("cuda", 0)
    with pytest.raises(ValueError, match="workers >= 1"):
        worker_devices("cpu", 1, 0)


@cpu_only
def test_cuda_on_a_cpu_only_build_names_the_key() -> None:
    with pytest.raises(ValueError) as err:
        require_device("cuda", "pairs.zoo-s.device")
    message = str(err.value)
    assert message.startswith("pairs.zoo-s.device: 'cuda'") and "CPU-only build" in message
    assert "make setup-gpu" in message and "\n" not in message


def test_a_cuda_build_without_a_gpu_and_a_missing_index_say_so(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    with pytest.raises(ValueError, match=r"^k: 'cuda' asks for CUDA; .* sees no GPU"):
        require_device("cuda", "k")
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"^k: 'cuda:2', but only 2 CUDA device\(s\) are visible"):
        require_device("cuda:2", "k")
    with pytest.raises(ValueError, match=r"^k: 'gpu0' is not a torch device"):
        require_device("gpu0", "k")
    assert require_device("cpu", "k") == torch.device("cpu")


@cpu_only
def test_a_stage_refuses_a_cuda_pair_before_any_work(monkeypatch) -> None:
    params = load_params(profile="smoke")
    pair_id = next(iter(params.pairs))
    on_cuda = params.pairs[pair_id].model_copy(update={"device": "cuda"})
    cuda = params.model_copy(update={"pairs": {**params.pairs, pair_id: on_cuda}})
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    with pytest.raises(ValueError, match=rf"^pairs\.{pair_id}\.device: 'cuda' asks for CUDA.*CPU-only"):
        apply_runtime(cuda)
    assert threads == []  # nothing set up for a run that cannot happen
    apply_runtime(params)
    assert threads == [params.runtime.torch_threads]


def test_pool_workers_take_distinct_gpus(monkeypatch) -> None:
    """Each worker's start (the pool's initializer, run here in turn) takes its own cuda:i and
    makes it current; three devices, three workers, none shared."""
    monkeypatch.setattr(pool, "cuda_device_count", lambda: 3)
    current, threads = [], torch.get_num_threads()
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(str(d)))
    monkeypatch.setattr(pool, "_device", None)  # this process is no worker once the test is over
    queue = pool.device_queue(multiprocessing.get_context("spawn"), "cuda", 3)
    taken = []
    for _ in range(3):
        pool._init_worker(threads, logging.getLogger().level, False, queue)
        taken.append(worker_device())
    assert taken == current == ["cuda:0", "cuda:1", "cuda:2"]


def test_cuda_without_a_gpu_fails_before_any_task(monkeypatch) -> None:
    monkeypatch.setattr(pool, "cuda_device_count", lambda: 0)
    ran = []
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        run_tasks(ran.append, [Task("a", (1,)), Task("b", (2,))], 2, 1, device="cuda")
    assert ran == []


def test_one_gpu_decodes_in_this_process_whatever_workers_says(monkeypatch) -> None:
    monkeypatch.setattr(pool, "cuda_device_count", lambda: 1)
    assert run_tasks(os.getpid, [Task("a", ()), Task("b", ())], 4, 1, device="cuda") == [os.getpid()] * 2


def _pid_and_device() -> tuple[int, str | None]:
    return os.getpid(), worker_device()


def test_cpu_workers_are_as_before() -> None:
    got = run_tasks(_pid_and_device, [Task(str(i), ()) for i in range(4)], 2, 1)
    assert {d for _, d in got} == {"cpu"} and os.getpid() not in {p for p, _ in got}
    assert len({p for p, _ in got}) <= 2


def test_configure_process_sets_threads_memory_and_device_in_that_order(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: calls.append(("keep",)) or True)
    monkeypatch.setattr(memory, "use_device", lambda d: calls.append(("device", d)))
    assert memory.configure_process(3, True, "cuda:1") is True
    assert calls == [("threads", 3), ("keep",), ("device", "cuda:1")]
    calls.clear()
    assert memory.configure_process(1, False) is False
    assert calls == [("threads", 1), ("device", None)]  # freed memory left alone when not asked


def test_a_pool_shares_out_gpus_only_for_a_bare_cuda() -> None:
    assert pool.pool_device(["cpu", "cuda", "cpu"]) == "cuda"
    assert pool.pool_device(["cpu", "cuda:1"]) == "cpu" and pool.pool_device([]) == "cpu"
