"""A local Ray instance that the project starts (collectors.collect.ray_backend.connect, no address given)
listens on loopback only and refuses a caller without Ray's auth token, even where the environment
asks for no auth or names a cluster (RAY_AUTH_MODE=disabled, RAY_ADDRESS)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
from ray._raylet import AuthenticationTokenLoader

from collectors.collect.ray_backend import LOOPBACK, connect, disconnect
from config.params import RayParams


@ray.remote
def _pid() -> int:
    return os.getpid()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[str]:
    """The backend's local instance with one worker process started; yields the GCS address."""
    env = pytest.MonkeyPatch()
    env.setenv("RAY_USAGE_STATS_ENABLED", "0")
    env.setenv("RAY_AUTH_MODE", "disabled")  # what the backend used to set for itself
    env.setenv("RAY_ADDRESS", "192.0.2.1:6379")  # not joined: joining takes collect.ray.address
    env.delenv("RAY_AUTH_TOKEN", raising=False)
    try:
        assert connect(RayParams(address="", num_cpus=1, gpus_per_task=0.0))
        assert ray.get(_pid.remote()) != os.getpid()
        yield ray.get_runtime_context().gcs_address
    finally:
        disconnect()
        env.undo()


def bound_sockets() -> list[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of every listening TCP socket and bound UDP socket of
    this process and every process it started."""
    me = psutil.Process()
    found = []
    for proc in (me, *me.children(recursive=True)):
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a worker that exited while being read
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == 2 and c.laddr):  # 2: SOCK_DGRAM
                found.append((proc.pid, name, c.laddr.ip, c.laddr.port))
    return found


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # a dual-stack socket bound to ::ffff:127.0.0.1
    return addr.is_loopback


def test_no_listener_binds_a_non_loopback_address(local_ray: str) -> None:
    host, port = local_ray.rsplit(":", 1)
    sockets = bound_sockets()
    names = {name for _, name, _, _ in sockets}
    assert host == LOOPBACK and int(port) in {p for _, _, _, p in sockets}, (local_ray, sockets)
    assert {"gcs_server", "raylet"} <= names, names  # the instance's servers were seen
    assert all(is_loopback(ip) for _, _, ip, _ in sockets), [s for s in sockets if not is_loopback(s[2])]


# a bare GCS client in a fresh process: reads one key, or prints why it could not
GCS_CALL = """import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"probe", None, timeout=10)
    print("answered")
except Exception as err:
    print(type(err).__name__, err)
"""


def call_gcs(address: str, home: Path, **auth: str) -> str:
    """GCS_CALL's last line with only ``auth``'s RAY_AUTH_* variables, and no ~/.ray token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | auth | {"HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-c", GCS_CALL, address], env=env, capture_output=True, text=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_caller_without_the_token_is_refused(local_ray: str, tmp_path: Path) -> None:
    refused = "AuthenticationError RPC error: InvalidAuthToken"
    assert call_gcs(local_ray, tmp_path, RAY_AUTH_MODE="disabled").startswith(refused)
    assert call_gcs(local_ray, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64).startswith(refused)
    token = AuthenticationTokenLoader.instance().get_raw_token()
    assert call_gcs(local_ray, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token) == "answered"


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
def test_loopback_addresses_are_recognised(ip: str) -> None:
    assert is_loopback(ip)


@pytest.mark.parametrize("ip", ["0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"])
def test_other_addresses_are_not(ip: str) -> None:
    assert not is_loopback(ip)
