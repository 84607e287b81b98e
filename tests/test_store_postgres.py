"""The PostgreSQL claim store against a real server: what the contract suite cannot see.

The shared server at 127.0.0.1:5432 (database ``test``) is used with a schema of each
test's own, ``beatless_test_{random}``, dropped afterwards; nothing else is touched but
one role a test creates, and drops, to use the store without the ``CREATE`` privilege.
The last case runs three real node processes and kills one with SIGKILL.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="the postgres store needs: pip install 'beatless[postgres]'")

import dataclasses

import psycopg
from fleet import assert_the_kill_was_survived, kill_one_of_three
from psycopg import sql
from service_check import require_service
from stores import POSTGRES, POSTGRES_URL, ManualClock, drop_postgres_schema, free_port
from waiting import wait_for

from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.node.runs import NEVER_LATE_MS, RUN_RECORD_MEMORY_MS
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import TOLERANCE_MS, Note
from beatless.stores.postgres.store import CHUNK, SCHEMA_VERSION, SWEEP_MIN, PostgresStore

MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
LEASE_MS = 5_000
TAG = "5eed7a95"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    """A connection to the shared server, for looking at rows behind the store's back."""
    require_service(*POSTGRES)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        yield connection


@pytest.fixture
def schema(conn: psycopg.Connection[Any]) -> Iterator[str]:
    """A schema name of the test's own; that schema, and only it, is dropped afterwards."""
    name = f"beatless_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_postgres_schema(name)


def url_of(schema: str, **query: str) -> str:
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return f"{POSTGRES_URL}?schema={schema}{extra}"


def server_now_ms(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)").fetchone()
    assert row is not None
    return int(row[0])


def firing(occurrence_ms: int, *, release_ms: int | None = None) -> ClaimRequest:
    id_ = str(uuid.uuid4())
    release = occurrence_ms if release_ms is None else release_ms
    return ClaimRequest(id_, f"test/{id_[:8]}", occurrence_ms, MAX_LATE_MS, MEMORY_MS, release, TAG)


def skipping(request: ClaimRequest) -> ClaimRequest:
    """The same firing, of an entry whose overlap policy is ``skip``."""
    return dataclasses.replace(request, run_id=run_lease_id(request.address))


def run_lease(address: str, now_ms: int) -> ClaimRequest:
    """A worker's claim of ``address``'s run lease, as ``beatless.node.runs`` makes it."""
    return ClaimRequest(
        run_lease_id(address), address, now_ms, NEVER_LATE_MS, RUN_RECORD_MEMORY_MS, now_ms
    )


def row_of(conn: psycopg.Connection[Any], schema: str, id_: str) -> dict[str, Any] | None:
    query = sql.SQL("SELECT * FROM {}.claims WHERE id = %s").format(sql.Identifier(schema))
    cursor = conn.execute(query, (id_,))
    row = cursor.fetchone()
    if row is None:
        return None
    assert cursor.description is not None
    return dict(zip([c.name for c in cursor.description], row, strict=True))


def execute(conn: psycopg.Connection[Any], schema: str, text: str, *args: object) -> None:
    conn.execute(sql.SQL(text).format(s=sql.Identifier(schema)), args)


# -- lateness and rows, on the server's clock ------------------------------------------------


def test_late_claim_is_refused_by_the_server_clock_and_writes_no_row(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn) - MAX_LATE_MS - TOLERANCE_MS - 2_000)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.LATE]
    assert row_of(conn, schema, request.id) is None
    store.close()


def test_pending_claim_is_a_row_on_the_server_clock_kept_past_its_lease_for_memory_ms(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    before = server_now_ms(conn)
    request = firing(before)
    assert store.claim([request], node="node|1", lease_ms=LEASE_MS) == [Outcome.WON]
    after = server_now_ms(conn)

    row = row_of(conn, schema, request.id)
    assert row is not None
    assert (row["format"], row["committed"], row["node"], row["tag"]) == (1, False, "node|1", TAG)
    assert (row["namespace"], row["address"], row["memory_ms"]) == (
        "default",
        request.address,
        MEMORY_MS,
    )
    assert before + LEASE_MS <= row["until_ms"] <= after + LEASE_MS
    assert row["forget_ms"] == row["until_ms"] + MEMORY_MS
    assert before <= row["claimed_ms"] <= after
    store.close()


def test_commit_keeps_the_claim_for_memory_ms_from_the_commit_on_the_server_clock(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    store.claim([request], node="a", lease_ms=LEASE_MS)

    before = server_now_ms(conn)
    assert store.commit([request.id], node="a") == [True]

    row = row_of(conn, schema, request.id)
    assert row is not None
    assert row["committed"] is True
    assert before + MEMORY_MS <= row["until_ms"] <= server_now_ms(conn) + MEMORY_MS
    # Kept until the end of the lease + memory_ms, which is no sooner than until_ms.
    assert row["forget_ms"] == row["claimed_ms"] + LEASE_MS + MEMORY_MS >= row["until_ms"]
    store.close()


def test_release_keeps_the_row_with_its_lease_ended_and_forgets_it_memory_ms_later(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    store.claim([request], node="a", lease_ms=LEASE_MS)

    before = server_now_ms(conn)
    store.release([request.id], node="a")

    row = row_of(conn, schema, request.id)
    assert row is not None
    assert row["committed"] is False
    assert before - 1 <= row["until_ms"] < server_now_ms(conn)
    assert row["forget_ms"] == row["claimed_ms"] + LEASE_MS + MEMORY_MS
    assert row["forget_ms"] >= row["until_ms"] + MEMORY_MS
    store.close()


def test_early_claim_writes_no_row(conn: psycopg.Connection[Any], schema: str) -> None:
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    request = firing(now, release_ms=now + TOLERANCE_MS + 5_000)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.EARLY]
    assert row_of(conn, schema, request.id) is None
    store.close()


@pytest.mark.parametrize("value", [2, 0, -1])
def test_a_row_of_another_format_fails_only_its_own_firing_as_corrupt_and_is_left_alone(
    conn: psycopg.Connection[Any], schema: str, value: int
) -> None:
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    fresh, unreadable, late = firing(now), firing(now), firing(now - MAX_LATE_MS - 20_000)
    store.claim([unreadable], node="a", lease_ms=LEASE_MS)
    execute(conn, schema, "UPDATE {s}.claims SET format = %s WHERE id = %s", value, unreadable.id)
    before = row_of(conn, schema, unreadable.id)

    outcomes = store.claim([fresh, unreadable, late], node="a", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.WON, Outcome.CORRUPT, Outcome.LATE]
    assert store.commit([unreadable.id, fresh.id], node="a") == [False, True]
    store.release([unreadable.id], node="a")
    assert row_of(conn, schema, unreadable.id) == before
    store.close()


# -- renewal and run leases, on the server's clock --------------------------------------------


def test_a_holder_s_reclaim_renews_its_lease_to_lease_ms_from_now_on_the_server_clock(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    first = row_of(conn, schema, request.id)
    assert first is not None
    time.sleep(0.05)

    before = server_now_ms(conn)
    assert store.claim([request], node="a", lease_ms=2 * LEASE_MS) == [Outcome.WON]
    after = server_now_ms(conn)

    row = row_of(conn, schema, request.id)
    assert row is not None
    assert before + 2 * LEASE_MS <= row["until_ms"] <= after + 2 * LEASE_MS
    assert row["until_ms"] > first["until_ms"]
    assert row["forget_ms"] == row["until_ms"] + MEMORY_MS
    # Still the same claim: granted when it was first won, to the same node, pending.
    assert (row["claimed_ms"], row["node"], row["committed"]) == (first["claimed_ms"], "a", False)
    with PostgresStore(url_of(schema)) as other:
        assert other.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.HELD]
    store.close()


def test_a_firing_whose_address_runs_is_a_committed_row_for_its_memory_on_the_server_clock(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store, worker = PostgresStore(url_of(schema)), PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    fresh = skipping(firing(now))
    lapsed = skipping(firing(now))  # a row whose pending lease ran out: a takeover otherwise
    assert store.claim([lapsed], node="x", lease_ms=1) == [Outcome.WON]
    time.sleep(0.01)
    for request in (fresh, lapsed):
        assert worker.claim([run_lease(request.address, now)], node="w", lease_ms=LEASE_MS) == [
            Outcome.WON
        ]

    before = server_now_ms(conn)
    assert store.claim([fresh, lapsed], node="a", lease_ms=LEASE_MS) == [Outcome.OVERLAP] * 2
    after = server_now_ms(conn)

    for request in (fresh, lapsed):
        row = row_of(conn, schema, request.id)
        assert row is not None
        assert (row["committed"], row["node"], row["tag"]) == (True, "a", TAG)
        assert before + MEMORY_MS <= row["until_ms"] <= after + MEMORY_MS
        assert row["forget_ms"] >= row["until_ms"]
        assert before <= row["claimed_ms"] <= after
    assert worker.claim([fresh], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]
    store.close()
    worker.close()


@pytest.mark.serial
def test_the_run_lease_is_read_without_a_lock_so_a_claim_never_waits_on_a_worker(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema, timeout="1s"))
    now = server_now_ms(conn)
    request = skipping(firing(now))
    assert store.claim([run_lease(request.address, now)], node="w", lease_ms=LEASE_MS) == [
        Outcome.WON
    ]

    # A worker's heartbeat in flight: the run lease's row is locked until it commits.
    with conn.transaction():
        execute(conn, schema, "SELECT 1 FROM {s}.claims WHERE id = %s FOR UPDATE", request.run_id)
        started = time.monotonic()
        assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.OVERLAP]
        assert time.monotonic() - started < 0.9
    store.close()


# -- the schema: version, creation, privileges ----------------------------------------------


def test_the_first_call_creates_the_schema_with_its_version_and_functions(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    store.probe()

    row = conn.execute(
        sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(schema))
    ).fetchone()
    assert row == (SCHEMA_VERSION,)
    names = conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s ORDER BY 1",
        (schema,),
    ).fetchall()
    assert [n for (n,) in names] == [
        "claim_v2",
        "claim_v3",
        "claim_v4",
        "claim_v5",
        "commit_v1",
        "keep_v1",
        "post_v1",
        "release_v1",
        "timeline_v1",
    ]
    tables = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
    ).fetchall()
    assert [t for (t,) in tables] == [
        "claims",
        "epochs",
        "kept_notes",
        "notes",
        "timelines",
        "version",
    ]
    store.close()


def test_a_schema_at_a_newer_version_is_refused_with_both_versions_named(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    PostgresStore(url_of(schema)).probe()
    execute(conn, schema, "UPDATE {s}.version SET version = %s", SCHEMA_VERSION + 1)
    store = PostgresStore(url_of(schema))

    newer, ours = SCHEMA_VERSION + 1, SCHEMA_VERSION
    with pytest.raises(StoreError, match=f"version {newer}.*up to version {ours}"):
        store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)
    store.close()


CLAIM_V1 = (
    "claim_v1(text, text, bigint, bigint, text, bigint, text, integer, text[], text[],"
    " bigint[], bigint[], bigint[], bigint[], text[], bigint)"
)


def test_a_version_1_schema_is_brought_up_in_place_keeping_its_claims_epoch_and_claim_v1(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    old = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    assert old.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert old.commit([request.id], node="a") == [True]
    old.close()
    # What version 1 left: the same tables, claim_v1 in place of claim_v2.
    execute(conn, schema, "DROP FUNCTION {s}.claim_v2")
    execute(conn, schema, "DROP FUNCTION {s}.claim_v3")
    execute(conn, schema, "DROP FUNCTION {s}.claim_v4")
    execute(conn, schema, "DROP FUNCTION {s}.claim_v5")
    execute(conn, schema, "ALTER TABLE {s}.claims DROP COLUMN revision")
    execute(conn, schema, "CREATE FUNCTION {s}." + CLAIM_V1 + " RETURNS void LANGUAGE sql AS ''")
    execute(conn, schema, "UPDATE {s}.version SET version = 1")

    new = PostgresStore(url_of(schema))
    assert new.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]

    assert new.epoch == old.epoch
    row = conn.execute(
        sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(schema))
    ).fetchone()
    assert row == (SCHEMA_VERSION,) == (2,)
    names = conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s ORDER BY 1",
        (schema,),
    ).fetchall()
    assert [n for (n,) in names] == [
        "claim_v1",
        "claim_v2",
        "claim_v3",
        "claim_v4",
        "claim_v5",
        "commit_v1",
        "keep_v1",
        "post_v1",
        "release_v1",
        "timeline_v1",
    ]
    new.close()


def test_a_schema_made_before_live_checks_gains_claim_v4_and_claim_v3_still_answers(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    PostgresStore(url_of(schema)).probe()
    execute(conn, schema, "DROP FUNCTION {s}.claim_v4")  # as a beatless before live checks
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    assert store.claim([firing(now)], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    # An earlier beatless still calls claim_v3, which calls claim_v4 with no live check.
    row = conn.execute(
        sql.SQL(
            "SELECT outcomes FROM {}.claim_v3('ns', 'old', 1000, 10000, '', NULL, 't', 0,"
            " ARRAY['x'], ARRAY['ns/e'], ARRAY[%s]::bigint[], ARRAY[60000]::bigint[],"
            " ARRAY[80000]::bigint[], ARRAY[%s]::bigint[], ARRAY['']::text[],"
            " ARRAY['']::text[], false, NULL)"
        ).format(sql.Identifier(schema)),
        (now, now),
    ).fetchone()
    assert row == ("W",)
    store.close()


def test_a_schema_made_before_claim_records_kept_revisions_gains_the_column_in_place(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    PostgresStore(url_of(schema)).probe()
    # As a beatless before revisions in records left it: no column, no claim_v5, and a row.
    execute(conn, schema, "DROP FUNCTION {s}.claim_v5")
    execute(conn, schema, "ALTER TABLE {s}.claims DROP COLUMN revision")
    now = server_now_ms(conn)
    execute(
        conn,
        schema,
        "INSERT INTO {s}.claims (until_ms, forget_ms, memory_ms, claimed_ms, occurrence_ms,"
        " format, committed, namespace, id, tag, node, address)"
        " VALUES (%s, %s, 80000, %s, %s, 1, true, 'ns', 'old', '', 'n0', 'ns/e')",
        now + 80_000,
        now + 80_000,
        now,
        now,
    )
    store = PostgresStore(url_of(schema), namespace="ns")
    live = dataclasses.replace(firing(now), revision=3)
    assert store.claim([live], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    # An earlier beatless still calls claim_v4, which records no revision.
    row = conn.execute(
        sql.SQL(
            "SELECT outcomes FROM {}.claim_v4('ns', 'old', 1000, 10000, '', NULL, 't', 0,"
            " ARRAY['x'], ARRAY['ns/e'], ARRAY[%s]::bigint[], ARRAY[60000]::bigint[],"
            " ARRAY[80000]::bigint[], ARRAY[%s]::bigint[], ARRAY['']::text[],"
            " ARRAY['']::text[], '{{}}', '{{}}', '{{}}', false, NULL)"
        ).format(sql.Identifier(schema)),
        (now, now),
    ).fetchone()
    assert row == ("W",)
    records = store.claim_records(["old", live.id, "x"])
    assert {id_: (r.node, r.revision) for id_, r in records.items()} == {
        "old": ("n0", None),
        live.id: ("a", 3),
        "x": ("old", None),
    }
    store.close()


def test_a_version_2_schema_made_before_notes_gains_them_in_place_keeping_its_claims(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    old = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    assert old.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert old.commit([request.id], node="a") == [True]
    old.close()
    # What a beatless without notes left: version 2, no notes table and no post_v1.
    execute(conn, schema, "DROP TABLE {s}.notes")
    execute(conn, schema, "DROP FUNCTION {s}.post_v1")

    new = PostgresStore(url_of(schema))
    assert new.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]
    new.post([Note("nodes", "b", "up", 60_000)])

    assert new.read_notes(["nodes"]) == {"nodes": {"b": "up"}}
    assert new.epoch == old.epoch
    row = conn.execute(
        sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(schema))
    ).fetchone()
    assert row == (SCHEMA_VERSION,) == (2,)
    new.close()


def test_nodes_that_start_together_create_the_schema_once_and_all_claim(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    stores = [PostgresStore(url_of(schema)) for _ in range(8)]
    request = firing(server_now_ms(conn))
    barrier = threading.Barrier(len(stores))
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes.extend(stores[index].claim([request], node=f"n{index}", lease_ms=LEASE_MS))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    assert sorted(o.value for o in outcomes) == ["held"] * 7 + ["won"]
    for store in stores:
        store.close()


def test_a_role_without_the_create_privilege_uses_a_schema_created_for_it(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    PostgresStore(url_of(schema)).probe()
    role = f"beatless_test_{uuid.uuid4().hex[:12]}"
    ident, name = sql.Identifier(role), sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(name, ident))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                name, ident
            )
        )
        url = f"postgresql://{role}@127.0.0.1:5432/test?schema={schema}"
        with PostgresStore(url) as store:
            store.probe()
            request = firing(server_now_ms(conn))
            assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
            assert store.commit([request.id], node="a") == [True]
        conn.execute(
            sql.SQL("REVOKE DELETE ON ALL TABLES IN SCHEMA {} FROM {}").format(name, ident)
        )
        with PostgresStore(url) as store, pytest.raises(StoreError, match="grant the role"):
            store.probe()
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_the_schema_file_is_package_data() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["beatless"]
    assert "stores/postgres/sql/*.sql" in package_data


# -- identity: the epoch and a lost schema ---------------------------------------------------


def test_the_first_claim_writes_the_namespace_epoch_once_and_every_store_object_adopts_it(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    a, b = PostgresStore(url_of(schema)), PostgresStore(url_of(schema))
    before = server_now_ms(conn)
    a.claim([firing(before)], node="a", lease_ms=LEASE_MS)
    b.claim([firing(before)], node="b", lease_ms=LEASE_MS)

    rows = conn.execute(
        sql.SQL("SELECT namespace, token, started_ms FROM {}.epochs").format(sql.Identifier(schema))
    ).fetchall()
    assert len(rows) == 1
    namespace, token, started_ms = rows[0]
    assert namespace == "default"
    assert before <= started_ms <= server_now_ms(conn)
    assert a.epoch is not None
    assert (a.epoch.token, a.epoch.started_ms) == (token, started_ms)
    assert b.epoch == a.epoch
    a.close()
    b.close()


def test_a_dropped_schema_gives_forgotten_to_a_store_object_that_saw_it_before(
    conn: psycopg.Connection[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    first = firing(now)
    assert store.claim([first], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.commit([first.id], node="a") == [True]
    old = store.epoch

    drop_postgres_schema(schema)
    with caplog.at_level(logging.WARNING, logger="beatless.stores.postgres.store"):
        outcomes = store.claim([first, firing(now)], node="a", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.FORGOTTEN, Outcome.FORGOTTEN]
    assert store.epoch is not None
    assert old is not None
    assert store.epoch.token != old.token
    row = row_of(conn, schema, first.id)
    assert row is not None
    assert row["committed"] is True
    assert "missing" in caplog.text
    assert "lost its memory" in caplog.text
    # Another node, which saw the old epoch too, is held off by the row written.
    assert PostgresStore(url_of(schema)).claim([first], node="b", lease_ms=LEASE_MS) == [
        Outcome.LOST
    ]
    store.close()


def test_after_a_lost_schema_only_firings_released_before_the_horizon_are_forgotten(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)
    drop_postgres_schema(schema)
    now = server_now_ms(conn)
    # The new epoch starts at about now; the horizon is 10 s later.
    after = firing(now, release_ms=now + TOLERANCE_MS + 1_000)
    before = firing(now)

    assert store.claim([before], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    time.sleep(1.2)  # so that after's release is within the early tolerance
    assert store.claim([after], node="a", lease_ms=LEASE_MS) in (
        [Outcome.WON],
        [Outcome.EARLY],
    )
    # The horizon is kept: a later batch of a firing released before it is still forgotten.
    assert store.claim([firing(now)], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    store.close()


def test_a_store_object_opened_after_the_schema_was_lost_adopts_the_new_epoch_and_wins(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    old = PostgresStore(url_of(schema))
    old.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)
    drop_postgres_schema(schema)
    new = PostgresStore(url_of(schema))

    assert new.claim([firing(server_now_ms(conn))], node="b", lease_ms=LEASE_MS) == [Outcome.WON]
    old.close()
    new.close()


def test_a_commit_does_not_adopt_a_changed_epoch(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)
    seen = store.epoch
    execute(conn, schema, "UPDATE {s}.epochs SET token = 'another'")

    assert store.commit(["nothing"], node="a") == [False]

    assert store.epoch == seen
    assert store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS) == [
        Outcome.FORGOTTEN
    ]
    store.close()


def test_a_dropped_function_is_created_again(conn: psycopg.Connection[Any], schema: str) -> None:
    store = PostgresStore(url_of(schema))
    store.probe()
    execute(conn, schema, "DROP FUNCTION {s}.commit_v1")
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    assert store.commit([request.id], node="a") == [True]
    store.close()


# -- namespaces, sweeping, reading ----------------------------------------------------------


def test_a_dropped_table_is_created_again(conn: psycopg.Connection[Any], schema: str) -> None:
    store = PostgresStore(url_of(schema))
    store.probe()
    execute(conn, schema, "DROP TABLE {s}.claims")

    assert store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    store.close()


def test_two_namespaces_in_one_schema_never_see_each_other_s_claims(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    one = PostgresStore(url_of(schema), namespace="one")
    two = open_store(url_of(schema), namespace="two")
    request = firing(server_now_ms(conn))

    assert one.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert two.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.WON]
    assert one.epoch != two.epoch
    assert [r["node"] for r in one.recent()] == ["a"]
    one.close()
    two.close()


def test_claims_sweep_rows_past_their_memory_in_bounded_batches(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    clock = ManualClock(time.time())
    store = PostgresStore(url_of(schema), clock=clock)
    committed = [firing(clock.now_ms()) for _ in range(SWEEP_MIN + 50)]
    store.claim(committed, node="a", lease_ms=LEASE_MS)
    store.commit([r.id for r in committed], node="a")
    clock.advance(LEASE_MS)
    abandoned = firing(clock.now_ms())
    store.claim([abandoned], node="a", lease_ms=LEASE_MS)
    assert len(store) == SWEEP_MIN + 51

    # The committed rows may go one lease + memory after their claim; the abandoned
    # pending claim is kept until its own lease + memory, so a takeover is reported.
    clock.advance(MEMORY_MS + 1)
    store.claim([firing(clock.now_ms())], node="a", lease_ms=LEASE_MS)
    assert len(store) == 51 + 1  # at most SWEEP_MIN rows deleted by one call
    store.claim([firing(clock.now_ms())], node="a", lease_ms=LEASE_MS)
    assert len(store) == 1 + 2
    assert row_of(conn, schema, abandoned.id) is not None

    clock.advance(LEASE_MS)
    store.claim([firing(clock.now_ms())], node="a", lease_ms=LEASE_MS)
    assert row_of(conn, schema, abandoned.id) is None
    store.close()


def test_recent_lists_who_won_and_when_newest_first(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    clock = ManualClock(time.time())
    store = PostgresStore(url_of(schema), clock=clock)
    first, second = firing(clock.now_ms()), firing(clock.now_ms())
    store.claim([first], node="a", lease_ms=LEASE_MS)
    clock.advance(5)
    store.claim([second], node="b", lease_ms=LEASE_MS)
    store.commit([second.id], node="b")

    rows = store.recent(5)

    assert [(r["id"], r["node"], r["committed"]) for r in rows] == [
        (second.id, "b", True),
        (first.id, "a", False),
    ]
    assert rows[0]["address"] == second.address
    assert rows[1]["claimed_ms"] == rows[0]["claimed_ms"] - 5
    assert store.recent(1)[0]["id"] == second.id
    store.close()


# -- round trips, batches, locks ----------------------------------------------------------------


class CountingConnection(psycopg.Connection[Any]):
    """A real connection that counts the statements it sends: one round trip each."""

    sent: list[str]

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        self.sent.append(str(query)[:40])
        return super().execute(query, params, **kw)


@pytest.fixture
def counting(conn: psycopg.Connection[Any]) -> Iterator[CountingConnection]:
    with CountingConnection.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.sent = []
        yield connection


def test_a_batch_of_claims_commits_or_releases_is_one_statement_each(
    counting: CountingConnection, schema: str
) -> None:
    store = PostgresStore(counting, schema=schema)
    store.probe()
    now = store.time_ms()
    counting.sent.clear()
    requests = [firing(now) for _ in range(1_000)]

    assert set(store.claim(requests, node="a", lease_ms=LEASE_MS)) == {Outcome.WON}
    assert len(counting.sent) == 1
    assert store.commit([r.id for r in requests[:500]], node="a") == [True] * 500
    store.release([r.id for r in requests[500:]], node="a")
    assert len(counting.sent) == 3
    store.close()
    assert not counting.closed


def test_a_commit_with_notes_is_one_statement_and_without_them_the_plain_commit(
    counting: CountingConnection, schema: str
) -> None:
    store = PostgresStore(counting, schema=schema)
    store.probe()
    now = store.time_ms()
    requests = [firing(now) for _ in range(3)]
    store.claim(requests, node="a", lease_ms=LEASE_MS)
    counting.sent.clear()

    notes = [Note("history", r.id, "sent", 60_000, keep=10) for r in requests[:2]]
    assert store.commit([r.id for r in requests[:2]], node="a", notes=notes) == [True, True]
    assert store.commit([requests[2].id], node="a", notes=()) == [True]
    assert store.commit([requests[2].id], node="a") == [True]

    assert len(counting.sent) == 3
    assert counting.sent[0] != counting.sent[1] == counting.sent[2]
    assert store.read_notes(["history"]) == {"history": {r.id: "sent" for r in requests[:2]}}
    store.close()


def test_a_commit_whose_notes_cannot_be_written_commits_nothing(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema, timeout="0.5s"))
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="a", lease_ms=60_000) == [Outcome.WON]
    store.post([Note("history", request.id, "claimed", 60_000)])
    history = [Note("history", request.id, "sent", 60_000)]

    # Another session holds the note's row, so the commit's notes wait past the timeout.
    with conn.transaction():
        execute(conn, schema, "SELECT FROM {s}.notes FOR UPDATE")
        with pytest.raises(StoreUnavailable):
            store.commit([request.id], node="a", notes=history)

    committed = conn.execute(
        sql.SQL("SELECT committed FROM {}.claims WHERE id = %s").format(sql.Identifier(schema)),
        (request.id,),
    ).fetchone()
    assert committed == (False,)
    assert store.read_notes(["history"]) == {"history": {request.id: "claimed"}}
    assert store.commit([request.id], node="a", notes=history) == [True]
    assert store.read_notes(["history"]) == {"history": {request.id: "sent"}}
    store.close()


def test_a_batch_larger_than_a_chunk_is_claimed_in_several_calls_in_order(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    requests = [firing(now) for _ in range(CHUNK + 10)]
    late = firing(now - MAX_LATE_MS - 20_000)
    batch = [*requests[:CHUNK], late, *requests[CHUNK:]]

    outcomes = store.claim(batch, node="a", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.WON] * CHUNK + [Outcome.LATE] + [Outcome.WON] * 10
    assert store.commit([r.id for r in batch], node="a") == [True] * CHUNK + [False] + [True] * 10
    store.close()


def test_nodes_claiming_committing_and_releasing_overlapping_batches_never_deadlock(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    # Every node sends the same firings, each in its own order, and commits or releases
    # what it won: the calls lock rows in one order, so none waits in a cycle.
    nodes = 6
    requests = [firing(server_now_ms(conn)) for _ in range(400)]
    stores = [PostgresStore(url_of(schema)) for _ in range(nodes)]
    stores[0].probe()
    won: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        import random

        rng = random.Random(index)
        try:
            for _ in range(3):
                batch = rng.sample(requests, len(requests))
                outcomes = stores[index].claim(batch, node=f"n{index}", lease_ms=60_000)
                mine = [r.id for r, o in zip(batch, outcomes, strict=True) if o.is_won]
                keep, give_back = mine[: len(mine) // 2], mine[len(mine) // 2 :]
                stores[index].release(list(reversed(give_back)), node=f"n{index}")
                done = stores[index].commit(keep, node=f"n{index}")
                with lock:
                    won.update(i for i, ok in zip(keep, done, strict=True) if ok)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors
    assert max(won.values()) == 1
    for store in stores:
        store.close()


def test_one_store_shared_by_threads_lets_each_firing_be_won_once(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    requests = [firing(server_now_ms(conn)) for _ in range(50)]
    results: list[Outcome] = []

    def run(index: int) -> None:
        results.extend(store.claim(requests, node=f"thread-{index}", lease_ms=LEASE_MS))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert Counter(results) == Counter({Outcome.WON: 50, Outcome.HELD: 150})
    store.close()


def test_a_commit_never_waits_for_a_long_call_of_another_thread_of_the_store_object(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    """A node's board claims missed-firing markers from a thread of its own through the
    store object its loop commits with. Here the board's claim waits on a row that
    another session holds locked: the loop's commit, whose lease is running, is made
    while that claim is still under way, not after it."""
    store = PostgresStore(url_of(schema))
    now = server_now_ms(conn)
    request, marker = firing(now), firing(now)
    assert store.claim([request, marker], node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    done: list[list[Outcome]] = []
    sweep = threading.Thread(
        target=lambda: done.append(store.claim([marker], node="a", lease_ms=LEASE_MS))
    )

    with conn.transaction():
        execute(conn, schema, "SELECT 1 FROM {s}.claims WHERE id = %s FOR UPDATE", marker.id)
        mine = conn.info.backend_pid
        sweep.start()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as watch:
            query = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"

            def blocked() -> bool:
                return (watch.execute(query, (mine,)).fetchone() or (0,))[0] == 1

            assert wait_for(blocked)
            committed = store.commit([request.id], node="a")
            under_way = blocked()
    sweep.join(10)

    assert under_way, "the commit waited for the other thread's claim to end"
    assert committed == [True]
    assert done == [[Outcome.WON]]
    store.close()


# -- failures: connections, timeouts, a frozen server --------------------------------------


@pytest.mark.serial
def test_a_claim_waiting_on_a_row_locked_elsewhere_times_out_as_store_unavailable(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema, timeout="1s"))
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    with conn.transaction():
        execute(conn, schema, "SELECT 1 FROM {s}.claims WHERE id = %s FOR UPDATE", request.id)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="statement timeout"):
            store.claim([request], node="b", lease_ms=LEASE_MS)
        assert time.monotonic() - started < 3

    assert store.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.HELD]
    store.close()


def test_a_connection_killed_by_the_server_is_reopened_for_the_same_call(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema, application_name=schema))
    store.probe()
    (killed,) = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
        (schema,),
    ).fetchone() or (0,)
    assert killed == 1
    time.sleep(0.2)

    # The call finds its connection cut and runs again at once on a new one (a restart
    # or a failover cuts every session: a commit must not wait for the next wake).
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    store.close()


@pytest.mark.serial
def test_a_server_that_stops_answering_makes_the_call_fail_within_its_timeout(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "faults"))
    try:
        from proxy import Proxy
    finally:
        sys.path.pop(0)
    with Proxy((POSTGRES[1], POSTGRES[2])) as proxy:
        url = f"postgresql://{proxy.host}:{proxy.port}/test?schema={schema}&timeout=1s"
        store = PostgresStore(url)
        store.probe()
        proxy.pause()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)
        took = time.monotonic() - started
        proxy.resume()
        assert 1 <= took < 5
        assert store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS) == [
            Outcome.WON
        ]
        store.close()


@pytest.mark.serial
def test_a_store_at_a_closed_port_raises_store_unavailable_quickly() -> None:
    store = PostgresStore(f"postgresql://127.0.0.1:{free_port()}/test")
    started = time.monotonic()

    with pytest.raises(StoreUnavailable, match="cannot probe"):
        store.probe()
    with pytest.raises(StoreUnavailable):
        store.time_ms()
    assert time.monotonic() - started < 2
    store.close()


def test_an_unknown_role_is_a_store_error_that_never_shows_the_password(
    conn: psycopg.Connection[Any],
) -> None:
    role = f"nobody_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(f"postgresql://{role}:s3cret-pass@127.0.0.1:5432/test")

    with pytest.raises(StoreError) as caught:
        store.probe()

    assert not isinstance(caught.value, StoreUnavailable)
    assert "check the user name, password and database name" in str(caught.value)
    assert "s3cret-pass" not in str(caught.value)
    assert "s3cret-pass" not in repr(store)
    store.close()


def test_a_missing_database_is_a_store_error(conn: psycopg.Connection[Any]) -> None:
    with PostgresStore("postgresql://127.0.0.1:5432/no_such_db_beatless") as store:
        with pytest.raises(StoreError, match="does not exist") as caught:
            store.claim([firing(0)], node="a", lease_ms=LEASE_MS)
        assert not isinstance(caught.value, StoreUnavailable)


def test_a_closed_store_refuses_calls_and_closing_twice_is_harmless(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    store.probe()
    store.close()
    store.close()

    with pytest.raises(StoreError, match="closed"):
        store.claim([firing(server_now_ms(conn))], node="a", lease_ms=LEASE_MS)


def test_close_leaves_a_connection_passed_in_open(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as mine:
        store = PostgresStore(mine, schema=schema)
        store.probe()
        store.close()
        assert not mine.closed
        assert mine.execute("SELECT 1").fetchone() == (1,)


def test_a_child_process_that_inherits_the_store_opens_a_connection_of_its_own(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    store = PostgresStore(url_of(schema))
    request = firing(server_now_ms(conn))
    assert store.claim([request], node="parent", lease_ms=LEASE_MS) == [Outcome.WON]

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            outcome = store.claim([request], node="child", lease_ms=LEASE_MS)
            code = 0 if outcome == [Outcome.HELD] else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert store.commit([request.id], node="parent") == [True]
    store.close()


# -- URLs and options ---------------------------------------------------------------------------


def test_open_store_routes_postgresql_and_postgres_urls_without_connecting() -> None:
    port = free_port()
    for scheme in ("postgresql", "postgres"):
        store = open_store(f"{scheme}://u:pw@127.0.0.1:{port}/db?schema=mine", namespace="ns")
        assert isinstance(store, PostgresStore)
        assert (store.schema, store.namespace) == ("mine", "ns")
        assert repr(store) == (
            f"PostgresStore('{scheme}://u:***@127.0.0.1:{port}/db?schema=mine', schema='mine')"
        )
        store.close()


def test_url_options_and_keywords_set_schema_and_timeout_and_keywords_win() -> None:
    store = PostgresStore("postgresql://h/db?schema=from_url&timeout=2s&sslmode=disable")
    assert (store.schema, store.timeout_s) == ("from_url", 2.0)
    store = PostgresStore("postgresql://h/db?schema=from_url", schema="kw", timeout=3)
    assert (store.schema, store.timeout_s) == ("kw", 3.0)
    assert PostgresStore("postgresql://h/db").schema == "beatless"


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("postgresql://h/db?shema=x", {}, "invalid URI query parameter"),
        ("mysql://h/db", {}, "unknown URL scheme"),
        ("postgresql://h/db?schema=1abc", {}, "schema must be an identifier"),
        ("postgresql://h/db?schema=pg_x", {}, "schema must be an identifier"),
        ("postgresql://h/db?schema=a;drop", {}, "schema must be an identifier"),
        ("postgresql://h/db?timeout=0", {}, "timeout must be positive"),
        ("postgresql://h/db", {"namespace": ""}, "namespace"),
    ],
)
def test_bad_urls_and_options_are_config_errors(
    url: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        PostgresStore(url, **options)


def test_bad_arguments_are_config_errors(schema: str) -> None:
    store = PostgresStore(url_of(schema))
    with pytest.raises(ConfigError, match="lease_ms"):
        store.claim([firing(0)], node="a", lease_ms=0)
    bad = ClaimRequest("id", "ns/a\x00b", 0, 1, 2, 0)
    with pytest.raises(ConfigError, match="NUL"):
        store.claim([bad], node="a", lease_ms=LEASE_MS)
    with pytest.raises(ConfigError, match="memory_ms"):
        store.claim([ClaimRequest("id", "ns/a", 0, 1, 0, 0)], node="a", lease_ms=LEASE_MS)
    with pytest.raises(ConfigError, match="autocommit"), psycopg.connect(POSTGRES_URL) as plain:
        PostgresStore(plain)
    with pytest.raises(ConfigError, match=r"psycopg\.Connection"):
        PostgresStore(42)  # type: ignore[arg-type]
    store.close()


def test_a_missing_driver_is_a_config_error_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ConfigError, match=r"pip install 'beatless\[postgres\]'"):
        PostgresStore("postgresql://h/db")


# -- real processes, one killed -------------------------------------------------------------


@pytest.mark.slow
def test_three_node_processes_with_one_killed_win_every_occurrence_exactly_once(
    conn: psycopg.Connection[Any], schema: str, tmp_path: Path
) -> None:
    """Three nodes for 50 s, n2 killed with SIGKILL after 8 s, and a squatter holding
    three coming firings pending, killed too: the survivors take those over once the
    lease runs out, well within max_late. Nothing is sent twice, nothing is missed."""
    url = url_of(schema)
    PostgresStore(url).probe()  # the schema exists before the nodes race to it
    run = kill_one_of_three(url, tmp_path, seconds=50, kill_at_s=8, squatter=True)
    assert_the_kill_was_survived(run)
