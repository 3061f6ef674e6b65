"""Scale-out: the collect stage's reports on a Ray cluster (a running one, or a local instance).

Contract:
- Where: joining a cluster is explicit. ``collect.ray.address`` ("auto", "host:port",
  "ray://host:port") joins a running cluster, with the cluster's own auth (its token from
  RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as Ray reads it). When it is empty, a local
  instance of ``collect.ray.num_cpus`` CPUs is started for the run and shut down after it; the
  RAY_ADDRESS environment variable is not joined (a warning says so).
- A local instance listens on 127.0.0.1 only (GCS, raylet, workers, runtime-env agent; no dashboard)
  and keeps Ray's token auth on whatever RAY_AUTH_MODE says: a caller on this machine without the
  token is refused, and nothing on another machine can reach it.
- No shared filesystem: the driver reads every input (the pair checkpoints' files, the tokenized
  prompts, the latency profiles) and sends it through the object store, and the project's packages
  travel as the job's ``py_modules``. Workers return each report's Arrow tables through the object
  store; the driver writes the report folders (collectors.collect.report.write_report, atomic), so a report
  exists on disk only once its tables are home. Nodes need the same Python packages installed.
- One actor per pair loads the pair once and runs that pair's reports in order. It holds
  ``runtime.torch_threads`` CPUs (the torch threads it runs, as the local backend does) and
  ``collect.ray.gpus_per_task`` GPUs, and is released when its last report is in, so pairs beyond
  the cluster's size start as others finish. Devices: with GPUs reserved Ray shows each actor only
  its own, so a bare ``cuda`` is that one; with none reserved, actors of ``cuda`` pairs take the
  driver's visible devices round-robin (``cuda:i``, decoder.models.devices.worker_devices).
- The tables equal the local backend's byte for byte: same prompts (plan.report_prompts, on the
  driver), same decode config, same collect_report, same writer.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray
from ray._private import ray_constants
from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR, _enable_token_auth
from ray._raylet import AuthenticationTokenLoader, Config
from tqdm import tqdm

from collectors.collect.plan import pair_tree, profile_for, report_inputs, report_prompts
from collectors.collect.report import ReportSpec, ReportTables, collect_report, write_report
from config.params import ROOT, Params, RayParams
from decoder.core.config import DecodeConfig
from decoder.deploy.latency import LatencyProfile
from decoder.models.devices import cuda_device_count, worker_devices
from decoder.models.memory import configure_process
from decoder.models.pair import load_pair

log = logging.getLogger(__name__)
# What a worker imports of the project: shipped with the job, so no node needs a checkout.
PY_MODULES = tuple(str(ROOT / p) for p in ("config", "decoder", "features", "collectors"))
LOOPBACK = "127.0.0.1"
TOKEN_ENV_VAR = "RAY_AUTH_TOKEN"
# the auth variables a local start changed, with their values before it (None: unset), for disconnect
_auth_before: dict[str, str | None] = {}


def read_folder(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` by relative POSIX path (a checkpoint folder to send)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint folder")
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def write_folder(files: dict[str, bytes], dest: Path) -> Path:
    """Recreate a folder read by :func:`read_folder` under ``dest``."""
    for rel, data in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dest


@dataclass(frozen=True)
class PairCheckpoint:
    """A registered pair's two model folders as bytes, and how to load them."""

    target: dict[str, bytes]
    mid: dict[str, bytes]
    dtype: str
    device: str
    linear: str


class PairWorker:
    """A Ray actor holding one pair's models; collects that pair's reports, returns their tables."""

    def __init__(
        self, checkpoint: PairCheckpoint, torch_threads: int, keep_freed: bool, device: str | None = None
    ) -> None:
        configure_process(torch_threads, keep_freed, device)
        with tempfile.TemporaryDirectory(prefix="treegraft-pair-") as tmp:
            target = write_folder(checkpoint.target, Path(tmp) / "target")
            mid = write_folder(checkpoint.mid, Path(tmp) / "mid")
            self.pair = load_pair(target, mid, checkpoint.dtype, checkpoint.device, checkpoint.linear)

    def collect(
        self,
        spec: ReportSpec,
        prompts: list[list[int]],
        profile: LatencyProfile,
        decode: DecodeConfig,
        mode: str,
        round_table_stride: int,
        batch_rows: int,
    ) -> ReportTables:
        return collect_report(
            spec, self.pair, prompts, profile, decode, mode, False, round_table_stride, batch_rows
        )


def connect(cfg: RayParams, address: str | None = None) -> bool:
    """Join the cluster at ``address`` or ``cfg.address`` with its own auth, else start a local
    instance on loopback with token auth (see the module docstring).

    Returns whether this call connected (and so must call :func:`disconnect`); an already
    initialized Ray is used as it is.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    address = address or cfg.address
    runtime_env = {"py_modules": list(PY_MODULES)}
    if address:
        log.info("ray: joining the cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return True
    if os.environ.get("RAY_ADDRESS"):
        log.warning(
            "ray: RAY_ADDRESS=%s is not joined (collect.ray.address joins a cluster); starting a local "
            "instance",
            os.environ["RAY_ADDRESS"],
        )
    _token_auth_on()
    try:
        with _loopback_node():
            # "local": a new instance even where RAY_ADDRESS is set or another instance runs here
            ray.init(
                address="local",
                _node_ip_address=LOOPBACK,
                num_cpus=cfg.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env=runtime_env,
            )
    except BaseException:
        disconnect()  # a start that failed leaves the environment as it found it
        raise
    return True


def _token_auth_on() -> None:
    """Ray's token auth for the local instance about to start and this driver (RAY_AUTH_MODE=token
    here and in the processes it starts), whatever RAY_AUTH_MODE said."""
    _auth_before.clear()
    _auth_before.update({k: os.environ.get(k) for k in (AUTH_MODE_ENV_VAR, TOKEN_ENV_VAR)})
    mode = os.environ.get(AUTH_MODE_ENV_VAR, "token")
    if mode.lower() != "token":
        log.warning("ray: %s=%s is ignored: a local instance runs with token auth", AUTH_MODE_ENV_VAR, mode)
    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        # a fresh token in this process's environment, inherited by the instance it starts: left to
        # itself Ray writes one to ~/.ray/auth_token with the umask's permissions (0644 under 022)
        os.environ[TOKEN_ENV_VAR] = secrets.token_hex(32)
        loader.reset_cache()
    _enable_token_auth()  # Ray's own switch: sets the mode variable and refreshes its cached config


def disconnect() -> None:
    """``ray.shutdown``, then the auth variables a local start changed put back, with Ray's cached
    view of them: this process's next join speaks the cluster's auth, not the finished instance's
    (a driver in token mode refuses the calls of a no-auth cluster's workers)."""
    ray.shutdown()
    if not _auth_before:
        return
    for name, value in _auth_before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _auth_before.clear()
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def _loopback_node() -> Iterator[None]:
    """Ray's servers listen on loopback only when the node's IP is exactly 127.0.0.1, but ray.init
    swaps a loopback ``_node_ip_address`` for the routable one unless clustering is off (Ray's
    macOS/Windows mode). Off for this start only: a later join must advertise a routable address."""
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _checkpoint(params: Params, pair_id: str) -> ray.ObjectRef:
    target, mid = params.pair_paths(pair_id)
    spec = params.pairs[pair_id]
    checkpoint = PairCheckpoint(read_folder(target), read_folder(mid), spec.dtype, spec.device, spec.linear)
    return ray.put(checkpoint)


def run_on_ray(
    params: Params,
    specs: list[ReportSpec],
    reports_dir: Path,
    address: str | None = None,
    inputs: Mapping[str, Mapping[str, object]] | None = None,
) -> list[Path]:
    """Collect every report on Ray, one actor per pair; returns the report folders written.

    ``inputs`` (report_id -> plan.report_inputs, as plan_reports gives them) go into each report's
    manifest; missing ones are computed here.
    """
    inputs = dict(inputs or {})
    for spec in specs:
        if spec.report_id not in inputs:
            inputs[spec.report_id] = report_inputs(params, spec)
    started = connect(params.collect.ray, address)
    actors: dict[str, ray.actor.ActorHandle] = {}
    try:
        return _collect_all(params, specs, Path(reports_dir), inputs, actors)
    finally:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            disconnect()


def actor_devices(params: Params, pair_ids: list[str], gpus_per_task: float) -> dict[str, str | None]:
    """Each pair actor's device to make current (None: leave it as Ray starts it). With GPUs reserved
    per actor Ray shows it only its own; without, the actors of bare ``cuda`` pairs take the driver's
    visible devices round-robin, in pair order, so two of them share a GPU only past the count."""
    cuda = [p for p in pair_ids if params.pairs[p].device == "cuda"]
    if gpus_per_task > 0 or not cuda:
        return dict.fromkeys(pair_ids)
    count = cuda_device_count()
    if count == 0:
        raise ValueError(
            f"pairs {cuda}: device cuda with collect.ray.gpus_per_task 0 takes the driver's visible "
            "GPUs (a local instance), and the driver sees none; on a cluster set gpus_per_task"
        )
    spread = dict(zip(cuda, worker_devices("cuda", count, len(cuda)), strict=True))
    return {p: spread.get(p) for p in pair_ids}


def _collect_all(
    params: Params,
    specs: list[ReportSpec],
    reports_dir: Path,
    inputs: Mapping[str, Mapping[str, object]],
    actors: dict[str, ray.actor.ActorHandle],
) -> list[Path]:
    cfg, threads = params.collect, params.runtime.torch_threads
    keep_freed = params.runtime.keep_freed_memory
    worker = ray.remote(PairWorker).options(num_cpus=threads, num_gpus=cfg.ray.gpus_per_task)
    by_pair: dict[str, list[ReportSpec]] = {}
    for spec in specs:
        by_pair.setdefault(spec.pair_id, []).append(spec)
    pending: dict[ray.ObjectRef, ReportSpec] = {}
    devices = actor_devices(params, list(by_pair), cfg.ray.gpus_per_task)
    for pair_id, pair_specs in by_pair.items():
        checkpoint = _checkpoint(params, pair_id)
        actors[pair_id] = actor = worker.remote(checkpoint, threads, keep_freed, devices[pair_id])
        tokenizer, profile = _tokenizer(params.pair_paths(pair_id)[0]), profile_for(params, pair_id)
        decode = DecodeConfig(cfg.max_new_tokens, 0.0, cfg.seed, pair_tree(params, pair_id))
        for spec in pair_specs:
            prompts = report_prompts(params, spec, tokenizer)
            call = actor.collect.remote(
                spec,
                prompts,
                profile,
                decode,
                cfg.mode,
                cfg.round_table_stride,
                params.runtime.replay_batch_rows,
            )
            pending[call] = spec
    left = {pair_id: len(s) for pair_id, s in by_pair.items()}
    done: list[Path] = []
    with tqdm(total=len(pending), desc="reports (ray)", unit="report") as bar:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ready[0])
            tables = ray.get(ready[0])
            done.append(write_report(reports_dir, spec, tables, params.tree.depth, inputs[spec.report_id]))
            left[spec.pair_id] -= 1
            if not left[spec.pair_id]:
                ray.kill(actors.pop(spec.pair_id))  # its CPUs go to a pair still waiting
            bar.update()
    return done
