"""The whole contract suite again, on the PostgreSQL store driven by a clock the test moves.

The functions on the server take the store's "now" as an argument that is NULL in use
(the server reads ``clock_timestamp()``); here every call passes the reading of a
:class:`~stores.ManualClock` instead, so the cases that land on an exact millisecond
(the last millisecond of a lease, of ``max_late + 10 s``, of a memory) and the property
test over long spans run against the SQL that decides them, without sleeping.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_store_contract as contract
from service_check import require_service
from stores import POSTGRES, POSTGRES_URL, Backend, ManualClock, Opener, StoreFactory

pytest.importorskip("psycopg", reason="the postgres store needs: pip install 'beatless[postgres]'")

from beatless.stores.postgres.store import PostgresStore


def _clocked_postgres(_tmp: Path, clock: ManualClock) -> Opener:
    from stores import drop_postgres_schema

    schema = f"beatless_test_{uuid.uuid4().hex[:12]}"

    class _Store(PostgresStore):
        def close(self) -> None:
            super().close()
            drop_postgres_schema(schema)

    return lambda: _Store(POSTGRES_URL, schema=schema, clock=clock)


BACKEND = Backend("postgres-clock", _clocked_postgres, service=POSTGRES)


def _factory(tmp_path: Path) -> Iterator[StoreFactory]:
    require_service(*POSTGRES)
    clock = ManualClock()
    factory = StoreFactory(BACKEND, BACKEND.prepare(tmp_path, clock), clock)
    yield factory
    factory.close()


@pytest.fixture
def store_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    yield from _factory(tmp_path)


@pytest.fixture
def clocked_store_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    yield from _factory(tmp_path)


# Every case of the contract suite, collected here under the fixtures above.
for _name in dir(contract):
    if _name.startswith("test_"):
        globals()[_name] = getattr(contract, _name)
