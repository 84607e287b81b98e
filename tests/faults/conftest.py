"""Fixtures of the fault suite: private Redis servers, TCP proxies and node fleets.

Everything a test starts is stopped by pid in the fixture's teardown, pass or fail.
A missing ``redis-server`` skips the suite locally and fails it with
``BEATLESS_REQUIRE_SERVICES=1`` (as in CI), like the services in ``tests/conftest.py``.

Run in parallel (``-n``, ``--dist loadgroup``), the scenarios go in lanes, each an xdist
group that one worker runs one scenario after another: at most one lane per worker but
one run at once (each scenario three to five node processes and servers of its own),
and a worker is left to the rest of the suite. The scenarios on a store of the machine's
shared RabbitMQ (a parameter id naming it) all go in the first lane, one after another:
RabbitMQ keeps a queue per claim, and three such scenarios at once slowed it past the
nodes' timeouts. The others, in the order collected, join whichever lane holds the
fewest scenarios so far, so that the lanes end together (a lane of its own for the few
RabbitMQ scenarios left the other lanes the longest part of the run).
A scenario that asserts how late a send was (not only that none came after max_late) is
marked ``serial`` instead, and runs in that group.
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

LANES_LEFT_FREE = 1
"""Workers that run no lane: ``lanes`` is the number of workers less this, at least 1."""
OWN_LANE = ("rabbitmq",)
"""Shared servers whose scenarios take turns in the first lane, never two at once."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    lanes = max(1, workers - LANES_LEFT_FREE)
    here = Path(__file__).parent
    scenarios = [
        item
        for item in items
        if item.path.is_relative_to(here)
        and item.get_closest_marker("slow") is not None
        and item.get_closest_marker("serial") is None
    ]
    counts = [0] * lanes
    for item in sorted(scenarios, key=lambda i: _own_lane(i) is None):  # stable
        lane = 0 if _own_lane(item) is not None else counts.index(min(counts))
        counts[lane] += 1
        item.add_marker(pytest.mark.xdist_group(f"faults-{lane}"))


def _own_lane(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    ids = callspec.id.split("-") if callspec is not None else []
    return next((server for server in OWN_LANE if server in ids), None)


def require_redis_server() -> None:
    """Skip unless ``redis-server`` is installed; fail instead when services are required."""
    if redis_server_binary() is not None:
        return
    reason = "redis-server is not installed; the fault suite starts private servers"
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Starts private ``redis-server`` processes on free ports (``appendonly=True``: one
    whose restart keeps what it held); kills them all at the end."""
    require_redis_server()
    servers: list[RedisServer] = []

    def start(name: str, *, appendonly: bool = False) -> RedisServer:
        server = RedisServer(tmp_path / name, name, appendonly=appendonly)
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
