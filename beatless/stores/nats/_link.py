"""The NATS store's connection: a nats-py client on an event loop of its own.

Only :meth:`Link.run` crosses threads: the store's calls come from any thread, and run
their coroutines (on :class:`~beatless.stores.nats._jetstream.Bucket`) on the loop. Calls
made at once run on the loop at once: nats-py multiplexes their requests on the one
connection (each waits for its own reply), so none waits for another's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.stores.nats._jetstream import Bucket, ConnectFailed, LoopStuck

if TYPE_CHECKING:
    from nats.aio.client import Client

logger = logging.getLogger("beatless.stores.nats.store")
T = TypeVar("T")

RECONNECTS = 2
"""Reconnections nats-py tries after a connection drops; then the next call connects anew."""
_REFUSED = re.compile(r"authori[sz]ation|authentication|permissions violation", re.IGNORECASE)


class Link:
    """A nats-py client on an event loop of its own, run in a thread this object starts.

    :meth:`run` runs a coroutine on that loop from any thread, several at once, and
    returns its result or raises what it raised. The client connects at the first call,
    and again at the first call after nats-py gave up reconnecting (calls that find it
    missing at once connect once). A child process that inherited the object starts a
    loop and a connection of its own, and leaves the parent's alone. ``refusal`` holds an
    error the server answered that retrying cannot mend (credentials, permissions),
    since no call was under way; ``scrub`` masks secrets.
    """

    def __init__(
        self,
        servers: list[str],
        bucket: str,
        timeout: float,
        scrub: Callable[[BaseException], str],
    ) -> None:
        self.servers, self.bucket, self.timeout, self.scrub = servers, bucket, timeout, scrub
        self.last_error = self.refusal = ""
        self._cond = threading.Condition()
        self._under_way = 0
        """Calls running on the loop now."""
        self._closed = False
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        self._kv: Bucket | None = None
        self._connecting: asyncio.Lock | None = None
        """Held on the loop while a call connects, so that calls at once connect once."""

    @property
    def requests(self) -> int:
        """How many requests this link sent, over every connection it made."""
        return 0 if self._kv is None else self._kv.requests

    def run(self, make: Callable[[Bucket], Awaitable[T]], limit: float) -> T:
        """Run ``make(bucket)`` on the loop, within ``limit`` seconds once connected.
        Raises :class:`ConnectFailed` once the link is closed."""
        if self._pid != os.getpid():
            self._forget()  # before the lock, which the parent may have held at the fork
        with self._cond:
            if self._closed:
                raise ConnectFailed("the store is closed")
            loop = self._running_loop()
            if not self._under_way:
                self.last_error = self.refusal = ""
            self._under_way += 1
        try:

            async def bounded() -> T:
                kv = await self._connect()
                return await asyncio.wait_for(make(kv), limit)

            future = asyncio.run_coroutine_threadsafe(bounded(), loop)
            concurrent.futures.wait([future], timeout=limit + self.timeout + 1)
            if not future.done():  # the loop itself is stuck: leave the call behind
                future.cancel()
                raise LoopStuck
            return future.result()
        finally:
            with self._cond:
                self._under_way -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Close the connection and stop the loop (not a parent process's), once the
        calls under way ended; later calls are refused."""
        if self._pid != os.getpid():
            self._forget()
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._under_way)
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            if loop is None or thread is None or self._pid != os.getpid():
                return
            try:
                closing = asyncio.run_coroutine_threadsafe(self._disconnect(), loop)
                closing.result(timeout=self.timeout)
            except Exception as exc:  # closing must not fail the caller
                logger.debug("nats store: close: %s", self.scrub(exc))
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=self.timeout)
                if not thread.is_alive():
                    loop.close()

    def alive(self) -> bool:
        """Whether the loop's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _forget(self) -> None:
        """In a child process: forget the parent's loop, thread and connection."""
        self._pid, self._loop, self._thread = os.getpid(), None, None
        self._client = self._kv = self._connecting = None
        self._cond, self._under_way = threading.Condition(), 0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="beatless-nats", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def _connect(self) -> Bucket:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            return await self._connected()

    async def _connected(self) -> Bucket:
        client = self._client
        if client is not None and not client.is_closed and not client.is_connected:
            # nats-py is reconnecting: wait for it to succeed or give up, rather than
            # queue requests that it would send whenever the connection comes back.
            deadline = asyncio.get_running_loop().time() + self.timeout
            while not (client.is_connected or client.is_closed):
                if asyncio.get_running_loop().time() > deadline:
                    raise ConnectFailed(self.last_error or "the connection dropped")
                await asyncio.sleep(0.05)
        if client is not None and client.is_connected and self._kv is not None:
            return self._kv
        import nats

        try:
            client = await nats.connect(
                servers=self.servers,
                name="beatless",
                connect_timeout=self.timeout,
                allow_reconnect=True,
                max_reconnect_attempts=RECONNECTS,
                reconnect_time_wait=0.25,
                error_cb=self._on_error,
            )
        except Exception as exc:
            raise ConnectFailed(self.last_error or self.scrub(exc)) from None
        sent = self.requests
        self._client, self._kv = client, Bucket(client, self.bucket, self.timeout)
        self._kv.requests = sent
        return self._kv

    async def _on_error(self, exc: Exception) -> None:
        self.last_error = text = self.scrub(exc)
        if _REFUSED.search(text):
            self.refusal = text  # kept over later errors, such as the reset after it
        logger.debug("nats store: %s", shown(text, quoted=False, limit=ERROR_LIMIT))

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            await client.close()
