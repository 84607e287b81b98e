"""``beatless explain --store`` says which live revision a firing ran under from its claim
record (issue 24, item 7), on real servers: a node sends a live entry's firing, then the
command reads the claim back; a record an earlier beatless wrote says the revision was not
recorded, and the line says so when it differs from the history's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from service_check import require_service
from stores import (
    POSTGRES,
    POSTGRES_URL,
    REDIS,
    delete_redis_prefix,
    drop_postgres_schema,
)

from beatless import Entry, Every, Schedule
from beatless.cli.command import main
from beatless.live import Live
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import Firing, iso
from beatless.stores import ClaimStore, open_store

Forget = Callable[[ClaimStore, str], None]
"""Rewrites a firing's claim record as an earlier beatless wrote it: no revision."""


def _forget_in_redis(store: ClaimStore, id_: str) -> None:
    client = store._client  # type: ignore[attr-defined]
    key = f"{store.prefix}claim:{id_}"  # type: ignore[attr-defined]
    value = client.get(key)
    value = value.decode() if isinstance(value, bytes) else value
    client.set(key, value.split("\x1f")[0], keepttl=True)


def _forget_in_postgres(store: ClaimStore, id_: str) -> None:
    import psycopg
    from psycopg import sql

    schema = store.schema  # type: ignore[attr-defined]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        query = sql.SQL("UPDATE {}.claims SET revision = NULL WHERE id = %s")
        conn.execute(query.format(sql.Identifier(schema)), (id_,))


@pytest.fixture(params=["redis", "postgres"])
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Forget]]:
    """A store URL and namespace of the test's own, and how to forget a revision there."""
    namespace = f"explain{uuid.uuid4().hex[:10]}"
    if request.param == "redis":
        require_service(*REDIS)
        yield f"redis://{REDIS[1]}:{REDIS[2]}/0", namespace, _forget_in_redis
        delete_redis_prefix(f"beatless:{namespace}:")
    else:
        require_service(*POSTGRES)
        schema = f"beatless_test_{uuid.uuid4().hex[:12]}"
        yield f"{POSTGRES_URL}?schema={schema}", namespace, _forget_in_postgres
        drop_postgres_schema(schema)


def sent_one(store: ClaimStore, namespace: str) -> Firing:
    """Run a node until it sends a firing of the live entry; its history is posted."""
    sent: list[Firing] = []
    node = Scheduler(Schedule([], namespace=namespace), store=store, node="n0", enqueue=sent.append)
    deadline = time.monotonic() + 20
    while not sent and time.monotonic() < deadline:
        node.board.sync()
        node.tick()
        time.sleep(0.05)
    assert sent, "the live entry fired within 20 s"
    node.board.sync()
    return sent[0]


def explained(capsys: pytest.CaptureFixture[str], url: str, plan: Path, at_ms: int) -> str:
    argv = ["explain", "report", "--at", iso(at_ms), "--store", url, "--schedule", str(plan)]
    assert main(argv) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  claim ")]
    return line


def test_explain_names_the_revision_the_claim_record_carries_and_an_unrecorded_one(
    fleet: tuple[str, str, Forget], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url, namespace, forget = fleet
    plan = tmp_path / "schedule.toml"  # the code schedule, beside the live entry
    plan.write_text(
        f'namespace = "{namespace}"\n\n[[entry]]\nname = "code"\ntask = "t.code"\nevery = "1h"\n'
    )
    store = open_store(url, namespace=namespace)
    try:
        live = Live(store, namespace=namespace)
        entry = Entry(name="report", task="t.job", trigger=Every(timedelta(seconds=1)))
        revision = live.put(entry, effective_in="2s")
        firing = sent_one(store, namespace)

        line = explained(capsys, url, plan, firing.occurrence_ms)
        assert f"by node n0, committed, under live revision {revision.number}" in line
        assert "differs" not in line

        forget(store, firing.id)
        line = explained(capsys, url, plan, firing.occurrence_ms)
        assert "revision not recorded" in line
        assert f"differs from the history, which names live revision {revision.number}" in line
    finally:
        store.close()
