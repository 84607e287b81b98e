"""The PostgreSQL store's connection: its URL and options, the driver, the watchdog that
cuts a call overrunning its deadline, and how the server's refusals are told apart."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from beatless.core._drivers import driver
from beatless.core.durations import DurationLike, as_timedelta
from beatless.errors import ConfigError
from beatless.stores.base import (
    ClaimRequest,
)

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("beatless.stores.postgres.store")
"""The store's logger, as before this module was split from it."""


SCHEMES = ("postgresql", "postgres")
OPTIONS = ("schema", "timeout")
"""URL query options the store reads itself; the others go to libpq."""
MAX_IDENTIFIER = 63


REFUSED = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
)
"""Words of a server's answer to a connection that retrying will not change."""


class Watchdog:
    """Cuts the connection of a call that overruns its deadline, so that the call fails
    with an error instead of waiting for a server that stopped answering.

    One daemon thread per store object, started with the first call; it sleeps until the
    earliest deadline of the calls in flight (calls of several threads run at once, each
    on a connection of its own) and, if that call is still running then, shuts its
    connection's socket down (a duplicate of its descriptor, made when the connection
    was opened). The driver then sees the connection closed, the call raises, and the
    store opens a new connection on the next call.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[object, tuple[float, socket.socket]] = {}
        """Each call in flight: its deadline and its connection's socket."""
        self._thread: threading.Thread | None = None
        self._stopped = False

    @contextmanager
    def bound(self, sock: socket.socket | None, seconds: float) -> Iterator[None]:
        if sock is None:
            yield
            return
        call = object()
        with self._cond:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="beatless-postgres-watchdog", daemon=True
                )
                self._thread.start()
            self._calls[call] = (time.monotonic() + seconds, sock)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._calls.pop(call, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._calls:
                    self._cond.wait()
                    continue
                call, (due, sock) = min(self._calls.items(), key=lambda item: item[1][0])
                left = due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                del self._calls[call]
                logger.warning("postgres store: a call went unanswered; cutting its connection")
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Link:
    """One connection of the store (``None`` until a call opens it), the duplicate of
    its socket the watchdog cuts, and whether the schema was checked on it. A connection
    passed in (``owned`` false) is never closed by the store."""

    def __init__(self, conn: psycopg.Connection[Any] | None = None, *, owned: bool = True) -> None:
        self.conn = conn
        self.owned = owned
        self.sock: socket.socket | None = None
        self.ready = False

    def drop(self) -> None:
        """Close the connection (one passed in is left open) and forget it."""
        conn, sock, self.conn, self.sock, self.ready = self.conn, self.sock, None, None, False
        if sock is not None:
            sock.close()
        if conn is not None and self.owned:
            with suppress(Exception):
                conn.close()


def postgres_driver() -> ModuleType:
    return driver("psycopg.sql", "the postgres store")


def split_url(url: str, where: str) -> tuple[str, dict[str, str]]:
    """The URL without the store's own query options, and those options."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"postgres store: unknown URL scheme {scheme!r} in {where}: use "
            f"postgresql://user:password@host:port/database"
        )
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in OPTIONS}
    rest = urlencode([(k, v) for k, v in pairs if k not in OPTIONS])
    return urlunsplit(("postgresql", parts.netloc, parts.path, rest, parts.fragment)), ours


def checked_conninfo(driver: ModuleType, conninfo: str, where: str) -> str:
    try:
        driver.conninfo.conninfo_to_dict(conninfo)
    except driver.ProgrammingError as exc:
        message = " ".join(str(exc).split())
        raise ConfigError(
            f"postgres store: bad URL {where}: {message}; the store's own options are "
            f"{', '.join(OPTIONS)}, the others are libpq's"
        ) from None
    return conninfo


def conninfo_params(driver: ModuleType, conninfo: str) -> dict[str, Any]:
    params: dict[str, Any] = driver.conninfo.conninfo_to_dict(conninfo)
    return params


def checked_schema(schema: object) -> str:
    if (
        not isinstance(schema, str)
        or not schema
        or len(schema.encode()) > MAX_IDENTIFIER
        or not (schema[0].isalpha() or schema[0] == "_")
        or not all(ch.isalnum() or ch in "_$" for ch in schema)
        or not schema.isascii()
        or schema.lower().startswith("pg_")
    ):
        raise ConfigError(
            f"postgres store: schema must be an identifier of letters, digits and '_' "
            f"(at most {MAX_IDENTIFIER}, not starting with a digit or 'pg_'), got {schema!r}"
        )
    return schema


def checked_timeout(timeout: DurationLike) -> float:
    seconds = as_timedelta(timeout, name="postgres store: timeout").total_seconds()
    if seconds <= 0:
        raise ConfigError(f"postgres store: timeout must be positive, got {timeout!r}")
    return seconds


def check_node(node: str) -> None:
    if not isinstance(node, str) or "\x00" in node:
        raise ConfigError(f"postgres store: node must be a string without NUL, got {node!r}")


def check_request(request: ClaimRequest) -> None:
    r = request
    if r.memory_ms <= 0 or r.max_late_ms < 0:
        raise ConfigError(
            f"postgres store: firing {r.id} ({r.address!r}): memory_ms must be positive and "
            f"max_late_ms not negative, got {r.memory_ms} and {r.max_late_ms}"
        )
    if "\x00" in r.id or "\x00" in r.address or "\x00" in r.run_id:
        raise ConfigError(
            f"postgres store: firing {r.id!r} ({r.address!r}): PostgreSQL text cannot hold "
            f"a NUL character"
        )


def is_refusal(text: str) -> bool:
    lowered = text.lower()
    return any(words in lowered for words in REFUSED)


def socket_of(conn: psycopg.Connection[Any]) -> socket.socket | None:
    """A socket object on a duplicate of the connection's descriptor, for the watchdog."""
    try:
        return socket.socket(fileno=os.dup(conn.pgconn.socket))
    except OSError:
        return None


def describe_where(conn: psycopg.Connection[Any]) -> str:
    info = conn.info
    return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"
