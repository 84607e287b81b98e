"""Fixtures shared by every test: the parametrized claim store, and real services."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from stores import BACKENDS, Backend, ManualClock, StoreFactory


def require_service(name: str, host: str, port: int, *, timeout: float = 1.0) -> None:
    """Skip the test unless ``host:port`` accepts a TCP connection.

    With ``BEATLESS_REQUIRE_SERVICES=1`` (as in CI) a missing service fails the test
    instead, so that a suite against real servers cannot pass by skipping them all.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        reason = f"{name} is not reachable at {host}:{port} ({exc})"
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


@pytest.fixture(params=[pytest.param(b, id=b.name) for b in BACKENDS])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens clients of one claim store; the test is run once per store in ``BACKENDS``."""
    yield from _factory(request.param, tmp_path)


@pytest.fixture(params=[pytest.param(b, id=b.name) for b in BACKENDS if not b.server_clock])
def clocked_store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Like ``store_factory``, for the cases that move the store's clock by hand to an
    exact millisecond: only the stores whose clock the test controls."""
    yield from _factory(request.param, tmp_path)


def _factory(backend: Backend, tmp_path: Path) -> Iterator[StoreFactory]:
    if backend.service is not None:
        require_service(*backend.service)
    clock = ManualClock()
    factory = StoreFactory(backend, backend.prepare(tmp_path, clock), clock)
    yield factory
    factory.close()
