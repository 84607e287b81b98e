"""Fixtures shared by every test: the parametrized claim store, and real services.

The suite runs in parallel (``python -m pytest -n auto --dist loadgroup``, pytest-xdist):
most of it waits on servers, worker processes and fault timelines, not on the CPU (the
whole suite used about 4 minutes of CPU in an hour), so ``-n auto`` starts two workers
per CPU. The hooks here make that safe for tests written
without it in mind:

- a test marked ``serial`` (it asserts how long something took, to a bound another
  test's load could break) runs in the ``serial`` group: one worker runs those one after
  another, never two at once;
- ``xdist_group("name")`` keeps a module's tests on one worker where they share what a
  module fixture made (a venv, a Redis database picked as empty);
- each worker starts the slow tests first, the longest unit of work first, so that no
  long test is left to run alone at the end; outside pytest-xdist the order is the files'.

Every test makes its servers' ports with ``ports.free_port`` (a slice per worker) and its
names (key prefixes, schemas, buckets, queues) with a random token, so two workers never
share one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_check import require_service
from stores import BACKENDS, Backend, ManualClock, StoreFactory

SERIAL_GROUP = "serial"
WORKERS_PER_CPU = 2
"""``-n auto``: workers per CPU. Measured on 2 CPUs: 8 workers ran the suite in 9 minutes
but slowed the shared RabbitMQ past the nodes' timeouts; with 6, a run beside another
load starved a demo node past its lease and a fleet on RabbitMQ past its wait; 4 leave
room."""
MAX_AUTO_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MAX_AUTO_WORKERS, WORKERS_PER_CPU * (cpus or 1))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_start_order)  # stable: the same order on every worker


def _start_order(item: pytest.Item) -> int:
    if item.get_closest_marker("slow") is None:
        return 2
    return 0 if item.get_closest_marker("faults") is not None else 1


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


@pytest.fixture(scope="session")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The Django project of ``tests/django_project.py``, set up and migrated once per
    process; its environment, for the processes that open the same databases."""
    pytest.importorskip("django_celery_beat", reason="needs: pip install 'beatless[django]'")
    import django_project as made

    with made.project(tmp_path_factory.mktemp("django")) as env:
        yield env
