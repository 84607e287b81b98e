"""A local Redis Cluster of three masters, started by the tests on loopback ports.

:class:`LocalCluster` starts ``redis-server`` processes with ``--cluster-enabled yes`` and
no persistence, joins them with ``redis-cli --cluster create``, waits until every node
says ``cluster_state:ok``, and stops them by pid. :func:`shared_cluster` starts one such
cluster per test process, on first use (so that selecting other tests starts nothing),
and stops it when the process exits. A test that needs a node emptied empties one of
this cluster's masters only; nothing here touches another Redis.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ports import BUS_OFFSET, free_port

from beatless.stores.base import ClaimStore
from beatless.stores.redis.cluster import RedisClusterStore

MASTERS = 3
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to stop the server if the test process dies without its teardown."""
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``; skip (or fail, with
    ``BEATLESS_REQUIRE_SERVICES=1``) when either is not on ``PATH``."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        reason = "redis-server and redis-cli are not on PATH; the cluster tests start their own"
        if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires them")
        pytest.skip(reason)
    return server, cli


class LocalCluster:
    """Three ``redis-server`` masters on free loopback ports, joined as one cluster."""

    def __init__(self, directory: Path, masters: int = MASTERS, replicas: int = 0) -> None:
        self.server, self.cli = binaries()
        self.directory = directory
        self.replicas = replicas  # per master
        self.ports = [free_port(also=BUS_OFFSET) for _ in range(masters * (1 + replicas))]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The store URL of the cluster: every master, as startup nodes."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> None:
        try:
            for port in self.ports:
                self._start_node(port)
            for port in self.ports:
                self._wait(lambda p=port: self._answers(p), f"node {port} to answer")
            self._create()
            for port in self.ports:
                self._wait(lambda p=port: self._state_ok(p), f"node {port}: cluster_state:ok")
        except BaseException:
            self.stop()
            raise

    def _start_node(self, port: int) -> None:
        args = [self.server, "--port", str(port), "--bind", "127.0.0.1"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        args += ["--dir", str(self.directory), "--save", "", "--appendonly", "no"]
        args += ["--logfile", str(self.directory / f"redis-{port}.log")]
        self.procs[port] = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads run in the child
        )

    def _create(self) -> None:
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        replicas = ["--cluster-replicas", str(self.replicas)]
        done = subprocess.run(
            [self.cli, "--cluster", "create", *nodes, *replicas, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [port for port, proc in self.procs.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"local cluster: gave up waiting for {what} (dead: {dead})")
            time.sleep(0.05)

    def node(self, port: int) -> Any:
        """A plain client of one node, for looking behind the store's back."""
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def _answers(self, port: int) -> bool:
        import redis

        try:
            with self.node(port) as client:
                return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False

    def _state_ok(self, port: int) -> bool:
        with self.node(port) as client:
            info = client.execute_command("CLUSTER INFO")
        # redis-py parses the reply into a dict, or leaves it text (older versions).
        if isinstance(info, dict):
            return info.get("cluster_state") == "ok"
        return "cluster_state:ok" in str(info)

    def flush(self, port: int) -> None:
        """Empty one master of this cluster, as a restart without persistence would."""
        if port not in self.procs:
            raise ValueError(f"port {port} is not a node of this cluster")
        with self.node(port) as client:
            client.flushall()

    def keys_on(self, port: int, match: str) -> list[str]:
        """The keys of one master that match a glob."""
        with self.node(port) as client:
            return list(client.scan_iter(match=match, count=1_000))

    def kill(self, port: int) -> None:
        """SIGKILL one node of this cluster by its pid."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)

    def restart_empty(self, port: int) -> None:
        """SIGKILL one master of this cluster and start it again on the same port, with no
        data (no persistence; its cluster config file keeps its slots), as a master that
        lost its memory; returns once every node says ``cluster_state:ok``."""
        self.kill(port)
        self._start_node(port)
        self._wait(lambda: self._answers(port), f"node {port} to answer again")
        for each in self.procs:
            self._wait(lambda p=each: self._state_ok(p), f"node {each}: cluster_state:ok")

    def stop(self) -> None:
        """Stop every node by its pid and remove the cluster's directory."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(self.directory, ignore_errors=True)


_shared: LocalCluster | None = None
_failed: list[str] = []
_shared_lock = threading.Lock()


def shared_cluster() -> LocalCluster:
    """This test process's cluster, started at its first use and stopped at exit. A
    cluster that would not start fails every test that needs it, without trying again."""
    global _shared  # noqa: PLW0603 - one cluster per test process
    with _shared_lock:
        if _failed:
            pytest.fail(_failed[0])
        if _shared is None:
            pytest.importorskip("redis", reason="the redis cluster store needs redis-py")
            binaries()
            cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="beatless-cluster-")))
            try:
                cluster.start()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                _failed.append(f"the local redis cluster did not start: {exc}")
                raise
            atexit.register(cluster.stop)
            _shared = cluster
        return _shared


class ClusterTestStore(RedisClusterStore):
    """A cluster store that deletes the keys under its own prefix, on every master of
    the test cluster and nowhere else, on close."""

    def close(self) -> None:
        delete_prefix(self.prefix)
        super().close()


def delete_prefix(prefix: str) -> None:
    """Delete the keys under ``prefix``, on every master of the test cluster."""
    cluster = shared_cluster()
    for port in cluster.ports:
        keys = cluster.keys_on(port, f"{prefix}*")
        with cluster.node(port) as client, client.pipeline(transaction=False) as pipe:
            for key in keys:  # one key per DEL: a cluster refuses keys of two slots
                pipe.delete(key)
            pipe.execute()


def new_prefix() -> str:
    """A key prefix no other test uses."""
    return f"beatless-test:{uuid.uuid4().hex}:"


def cluster_opener() -> Callable[[], ClaimStore]:
    """Opens clients of one cluster store under a prefix of its own, on the shared
    cluster (started now if it is not yet): the contract suite's backend."""
    cluster = shared_cluster()
    prefix = new_prefix()
    from stores import Forgetful

    return Forgetful(
        lambda: ClusterTestStore(cluster.url, prefix=prefix), lambda: delete_prefix(prefix)
    )
