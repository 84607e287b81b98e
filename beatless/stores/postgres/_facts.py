"""The settings of a PostgreSQL server that decide whether its claims survive, judged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from beatless.stores.base import (
    UNKNOWN,
    Fact,
    StoreFacts,
    Verdict,
)

if TYPE_CHECKING:
    pass


SETTINGS_QUERY = (
    "SELECT current_setting('synchronous_commit'), current_setting('fsync'), "
    "pg_is_in_recovery(), current_setting('synchronous_standby_names'), "
    "(SELECT count(*) FROM pg_stat_replication), "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END"
)
"""What :meth:`PostgresStore.facts` reads, in one round trip."""


def timeline_of(walfile: object) -> int | None:
    """The timeline of a write-ahead log file's name (its first 8 hex digits), or
    ``None`` (a standby, or a name not read)."""
    text = str(walfile) if walfile else ""
    try:
        return int(text[:8], 16) if len(text) >= 8 else None
    except ValueError:
        return None


def settings_facts(store: str, row: Sequence[Any] | None) -> StoreFacts:
    """The facts of a PostgreSQL server from the row of ``SETTINGS_QUERY`` (``None``: unread)."""
    if row is None:
        why = "could not be read"
        names = ("synchronous_commit", "fsync", "standby", "replicas")
        return StoreFacts(store, tuple(Fact(n, UNKNOWN, Verdict.WARN, why) for n in names))
    sync_commit, fsync, standby, standby_names, replicas = row
    facts = [Fact("synchronous_commit", str(sync_commit))]
    if sync_commit == "off":
        why = (
            "a crash of the server loses the last claims it acknowledged (up to three "
            "wal_writer_delay), and their firings may be sent again; ALTER ROLE ... SET "
            "synchronous_commit = on for the role the nodes use"
        )
        facts[0] = Fact("synchronous_commit", "off", Verdict.WARN, why)
    if fsync == "off":
        why = "a crash of the server's host may lose or corrupt claims; set fsync = on"
        facts.append(Fact("fsync", "off", Verdict.WARN, why))
    else:
        facts.append(Fact("fsync", str(fsync)))
    if standby:
        why = "a standby (in recovery) is read-only: point the URL at the primary"
        facts.append(Fact("standby", "yes", Verdict.REFUSE, why))
    else:
        facts.append(Fact("standby", "no"))
    count = int(replicas or 0)
    if count and not standby_names:
        why = (
            "replication is asynchronous (synchronous_standby_names is empty): a standby "
            "promoted by a failover may lack the last claims, and their firings may be sent "
            "again"
        )
        facts.append(Fact("replicas", str(count), Verdict.WARN, why))
    else:
        sync = f" (synchronous: {standby_names})" if count and standby_names else ""
        facts.append(Fact("replicas", f"{count}{sync}"))
    return StoreFacts(store, tuple(facts))
