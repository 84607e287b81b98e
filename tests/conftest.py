"""Fixtures shared by every test: the parametrized claim store, and real services."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from service_check import require_service
from stores import BACKENDS, Backend, ManualClock, StoreFactory


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
