"""``beatless status --dramatiq``: a ``dramatiq`` CLI node seen through its registry record,
and the death of its scheduler process shown there, not only in a log line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dramatiq_nodes import (
    REDIS_URL,
    ROOT,
    delete_keys,
    environment,
    start_node,
    stop_nodes,
    wait_for_schedulers,
)
from service_check import require_service

pytestmark = pytest.mark.slow
APP = "integrations.dramatiq_redis.app"


@pytest.fixture
def namespace() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    name = f"bl-status-{uuid.uuid4().hex[:10]}"
    yield name
    delete_keys(name)


def status(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "beatless", "status", "--dramatiq", APP, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def wait_for(env: dict[str, str], what: str, test: Any, timeout: float) -> tuple[int, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, report = status(env)
        if test(code, report):
            return code, report
        if time.monotonic() > deadline:
            pytest.fail(f"status never showed {what} within {timeout:g}s: {report}")
        time.sleep(0.5)


def test_a_killed_scheduler_process_shows_in_the_registry_and_status(
    tmp_path: Path, namespace: str
) -> None:
    env = environment(namespace, REDIS_URL, "")
    node = start_node(env, tmp_path / "node.log")
    try:
        wait_for_schedulers([node])
        code, report = wait_for(
            env, "a healthy node", lambda c, r: c == 0 and len(r["nodes"]) == 1, 30
        )
        (first,) = report["nodes"]
        assert first["framework"] == "dramatiq"
        assert first["restarts"] == 0
        assert first["last_failure"] is None

        (victim,) = node.schedulers()
        victim.send_signal(signal.SIGKILL)

        code, report = wait_for(
            env,
            "the restarted scheduler with its predecessor's death",
            lambda c, r: any(n["restarts"] == 1 for n in r["nodes"]),
            40,
        )
        restarted = next(n for n in report["nodes"] if n["restarts"] == 1)
        assert restarted["last_failure"] == "killed by SIGKILL"
        assert restarted["pid"] != victim.pid
        assert code == 1
        assert any(
            "its scheduler process died" in p and "killed by SIGKILL" in p
            for p in report["problems"]
        ), report["problems"]
    finally:
        stop_nodes([node])
