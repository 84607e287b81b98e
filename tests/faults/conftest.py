"""Fixtures of the fault suite: private Redis servers, TCP proxies and node fleets.

Everything a test starts is stopped by pid in the fixture's teardown, pass or fail.
A missing ``redis-server`` skips the suite locally and fails it with
``BEATLESS_REQUIRE_SERVICES=1`` (as in CI), like the services in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Fleet
from proxy import Proxy
from redis_server import RedisServer, redis_server_binary


def require_redis_server() -> None:
    """Skip unless ``redis-server`` is installed; fail instead when services are required."""
    if redis_server_binary() is not None:
        return
    reason = "redis-server is not installed; the fault suite starts private servers"
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[[str], RedisServer]]:
    """Starts private ``redis-server`` processes on free ports; kills them all at the end."""
    require_redis_server()
    servers: list[RedisServer] = []

    def start(name: str) -> RedisServer:
        server = RedisServer(tmp_path / name, name)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.kill()


@pytest.fixture
def proxy() -> Iterator[Callable[[tuple[str, int]], Proxy]]:
    """Opens TCP proxies to a target; closes them (and joins their threads) at the end."""
    proxies: list[Proxy] = []

    def open_proxy(target: tuple[str, int]) -> Proxy:
        opened = Proxy(target)
        proxies.append(opened)
        return opened

    try:
        yield open_proxy
    finally:
        for opened in proxies:
            opened.close()


@pytest.fixture
def fleet(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[dict[str, Any]], Fleet]]:
    """Makes the scenario's :class:`Fleet`; stops every node by pid at the end."""
    fleets: list[Fleet] = []
    scenario = re.sub(r"^test_", "", request.node.name)

    def make(schedule: dict[str, Any]) -> Fleet:
        made = Fleet(tmp_path / f"fleet{len(fleets)}", scenario, schedule)
        fleets.append(made)
        return made

    try:
        yield make
    finally:
        for made in fleets:
            made.stop()
