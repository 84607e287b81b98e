"""The PostgreSQL store's schema: its functions, the statements the store sends, and
the preparing of the schema (created, brought up to date, or refused when newer)."""

from __future__ import annotations

import logging
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any

from beatless.core._logtext import shown
from beatless.errors import StoreError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

logger = logging.getLogger("beatless.stores.postgres.store")
"""The store's logger, as before this module was split from it."""


SCHEMA_VERSION = 2
"""The layout of the schema (tables and functions) written now; a newer one is refused.
Version 2 replaced ``claim_v1`` with ``claim_v2``, which checks run leases
(:attr:`~beatless.stores.base.Outcome.OVERLAP`); a version 1 schema is brought up to it in
place (its tables are the same, and it keeps ``claim_v1``)."""

FUNCTIONS = (
    "claim_v2(text, text, bigint, bigint, text, bigint, text, integer, text[], text[],"
    " bigint[], bigint[], bigint[], bigint[], text[], text[], bigint)",
    "claim_v3(text, text, bigint, bigint, text, bigint, text, integer, text[], text[],"
    " bigint[], bigint[], bigint[], bigint[], text[], text[], boolean, bigint)",
    "claim_v4(text, text, bigint, bigint, text, bigint, text, integer, text[], text[],"
    " bigint[], bigint[], bigint[], bigint[], text[], text[], integer[], bytea[], bytea[],"
    " boolean, bigint)",
    "claim_v5(text, text, bigint, bigint, text, bigint, text, integer, text[], text[],"
    " bigint[], bigint[], bigint[], bigint[], text[], text[], integer[], bytea[], bytea[],"
    " bigint[], boolean, bigint)",
    "commit_v1(text, text, text[], bigint)",
    "release_v1(text, text, text[], bigint)",
    "post_v1(text, bytea[], bytea[], text[], text[], bytea[], bigint[], integer[], integer,"
    " bigint)",
    "keep_v1(text, bytea[], bytea[], text[], text[], bytea[])",
    "timeline_v1(text, bigint)",
)
"""The functions of this schema version, with their arguments' types."""
SQL_FILE = "sql/postgres.sql"


class Statements:
    """The statements the store sends, composed once with its schema's name."""

    def __init__(self, schema: str) -> None:
        from psycopg import sql

        name = sql.Identifier(schema)

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(s=name)

        self.claim = q(
            "SELECT outcomes, epoch_token, epoch_started_ms FROM {s}.claim_v5("
            "%s, %s, %s, %s, %s, %s, %s, %s, %s::text[], %s::text[], %s::bigint[], "
            "%s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::integer[], "
            "%s::bytea[], %s::bytea[], %s::bigint[], %s::boolean, %s::bigint)"
        )
        commit = q("{s}.commit_v1(%s, %s, %s::text[], %s::bigint)")
        post = q(
            "{s}.post_v1(%s, %s::bytea[], %s::bytea[], %s::text[], %s::text[],"
            " %s::bytea[], %s::bigint[], %s::integer[], %s, %s::bigint)"
        )
        self.commit = sql.SQL("SELECT flags, epoch_token, epoch_started_ms FROM {}").format(commit)
        # One statement, so one transaction. post_v1 is in the select list: it runs on
        # commit_v1's one row, after it, so the notes' locks come after the claims' (no
        # call holds a note's lock while it waits for a claim's: never a cycle).
        self.commit_notes = sql.SQL(
            "SELECT c.flags, c.epoch_token, c.epoch_started_ms, {post} FROM {commit} AS c"
        ).format(post=post, commit=commit)
        self.release = q("SELECT {s}.release_v1(%s, %s, %s::text[], %s::bigint)")
        self.post = sql.SQL("SELECT {}").format(post)
        self.read_notes = q(
            "SELECT kind_id, key, value FROM {s}.notes"
            " WHERE namespace = %s AND kind_id = ANY (%s::bytea[]) AND until_ms >="
            " coalesce(%s::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000))"
        )
        self.read_synced = q(
            "SELECT false, kind_id, key, value FROM {s}.notes"
            " WHERE namespace = %s AND kind_id = ANY (%s::bytea[]) AND until_ms >="
            " coalesce(%s::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000))"
            " UNION ALL SELECT true, n.kind_id, n.key, n.value FROM {s}.kept_notes AS n"
            " JOIN unnest(%s::bytea[], %s::bytea[]) AS w(kind_id, key_id)"
            " ON n.kind_id = w.kind_id AND n.key_id = w.key_id WHERE n.namespace = %s"
        )
        self.timeline = q("SELECT {s}.timeline_v1(%s, %s)")
        self.keep = q(
            "SELECT {s}.keep_v1(%s, %s::bytea[], %s::bytea[], %s::text[], %s::text[], %s::bytea[])"
        )
        self.read_kept = q(
            "SELECT key, value FROM {s}.kept_notes WHERE namespace = %s AND kind_id = %s"
        )
        self.read_kept_keys = q(
            "SELECT key, value FROM {s}.kept_notes"
            " WHERE namespace = %s AND kind_id = %s AND key_id = ANY (%s::bytea[])"
        )
        self.delete_kept = q(
            "DELETE FROM {s}.kept_notes"
            " WHERE namespace = %s AND kind_id = %s AND key_id = ANY (%s::bytea[])"
        )
        self.now = sql.SQL("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        self.recent = q(
            "SELECT id, address, occurrence_ms, node, committed, until_ms, claimed_ms"
            " FROM {s}.claims WHERE namespace = %s AND format = 1"
            " ORDER BY claimed_ms DESC, id LIMIT %s"
        )
        self.records = q(
            "SELECT id, node, committed, until_ms, revision FROM {s}.claims"
            " WHERE namespace = %s AND id = ANY (%s::text[]) AND format = 1"
        )
        self.count = q("SELECT count(*) FROM {s}.claims")
        self.probe_write = q(
            "INSERT INTO {s}.claims (until_ms, forget_ms, memory_ms, claimed_ms, occurrence_ms,"
            " format, committed, namespace, id, tag, node, address)"
            " VALUES (0, 0, 0, 0, 0, 1, true, %s, %s, '', %s, 'probe')"
        )
        self.probe_read = q("SELECT node FROM {s}.claims WHERE namespace = %s AND id = %s")
        self.probe_delete = q("DELETE FROM {s}.claims WHERE namespace = %s AND id = %s")


class Schema:
    """Brings a schema to :data:`SCHEMA_VERSION`, or refuses one that is newer."""

    def __init__(self, driver: ModuleType, schema: str, where: str) -> None:
        self.driver, self.schema, self.where = driver, schema, where
        self.name = driver.sql.Identifier(schema)

    def prepare(self, conn: psycopg.Connection[Any], *, force: bool = False) -> None:
        """Check the schema, and create or upgrade it only when it needs it (``force``:
        run the whole script again, as after a call found a table or function missing)."""
        version, functions = self._state(conn)
        self._refuse_newer(version)
        if version == SCHEMA_VERSION and functions == len(FUNCTIONS) and not force:
            return
        with conn.transaction():
            # Nodes that start together queue here; the first creates, the others check.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"beatless schema {self.schema}",),
            )
            version, functions = self._state(conn)
            self._refuse_newer(version)
            if version == SCHEMA_VERSION and functions == len(FUNCTIONS) and not force:
                return
            sql = self.driver.sql
            exists = conn.execute(
                "SELECT to_regnamespace(%s) IS NOT NULL", (self.name.as_string(conn),)
            )
            if not exists.fetchone()[0]:  # type: ignore[index]
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(self.name))
            path = self.name.as_string(conn)
            conn.execute("SELECT set_config('search_path', %s, true)", (path,))
            conn.execute(schema_script())
            conn.execute(
                "INSERT INTO version (version) VALUES (%s) ON CONFLICT (only_row)"
                " DO UPDATE SET version = excluded.version",
                (SCHEMA_VERSION,),
            )
        logger.info(
            "postgres store %s: schema %s created or upgraded to version %d",
            shown(self.where, quoted=False),
            shown(self.schema),
            SCHEMA_VERSION,
        )

    def _state(self, conn: psycopg.Connection[Any]) -> tuple[int | None, int]:
        """The schema's version (``None``: no version table) and how many of this
        version's functions it has."""
        prefix = self.name.as_string(conn) + "."
        row = conn.execute(
            "SELECT (SELECT count(to_regprocedure(f)) FROM unnest(%s::text[]) AS f),"
            " to_regclass(%s) IS NOT NULL",
            ([prefix + f for f in FUNCTIONS], prefix + "version"),
        ).fetchone()
        if row is None:
            raise StoreError(f"postgres store {self.where}: the server returned no row")
        functions, has_table = int(row[0]), bool(row[1])
        if not has_table:
            return None, functions
        query = self.driver.sql.SQL("SELECT max(version) FROM {}.version").format(self.name)
        found = conn.execute(query).fetchone()
        version = None if found is None or found[0] is None else int(found[0])
        return version, functions

    def _refuse_newer(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"postgres store {self.where}: schema {self.schema!r} has version {version}, "
                f"written by a newer beatless; this one reads up to version {SCHEMA_VERSION}: "
                f"upgrade beatless on every node, or point this node at another schema"
            )


def schema_script() -> str:
    return (resources.files("beatless.stores.postgres") / SQL_FILE).read_text("utf-8")
