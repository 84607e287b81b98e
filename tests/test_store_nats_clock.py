"""The whole contract suite again, on the NATS store driven by a clock the test moves.

In use the store reads the server's clock from the stamp of a message it writes at the
start of each call; here that reading is replaced by a :class:`~stores.ManualClock`, so
the cases that land on an exact millisecond (the last millisecond of a lease, of
``max_late + 10 s``, of a memory) and the property test over long spans run against the
real bucket, the values written in it and the revision-checked writes, without sleeping.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_store_contract as contract
from service_check import require_service
from stores import NATS, NATS_URL, Backend, ManualClock, Opener, StoreFactory, delete_nats_bucket

pytest.importorskip("nats", reason="the nats store needs: pip install 'beatless[nats]'")

from beatless.stores.nats._jetstream import Bucket
from beatless.stores.nats.store import NATSStore, _State


def _clocked_nats(_tmp: Path, clock: ManualClock) -> Opener:
    bucket = f"beatless_test_{uuid.uuid4().hex[:12]}"

    class _Store(NATSStore):
        async def _state(self, kv: Bucket) -> _State:
            state = await super()._state(kv)
            return dataclasses.replace(state, now_ms=clock.now_ms())

        def close(self) -> None:
            super().close()
            delete_nats_bucket(bucket)

    return lambda: _Store(NATS_URL, bucket=bucket)


BACKEND = Backend("nats-clock", _clocked_nats, service=NATS)


def _factory(tmp_path: Path) -> Iterator[StoreFactory]:
    require_service(*NATS)
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
