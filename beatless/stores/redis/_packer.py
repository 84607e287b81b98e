"""How a Redis store made from a URL writes its commands on the wire.

redis-py packs a command in Python when ``hiredis`` is not installed, copying its growing
buffer once per argument and cutting the result into pieces of 6,000 bytes, each sent with
its own ``sendall``. A claim of a wake's firings is one ``EVALSHA`` of several hundred
arguments: packed that way it took 2.3 ms and ~30 system calls for 50 firings, on the path
of every firing's lateness. :class:`Packer` writes the same bytes in one pass and one piece
(0.1 ms). With ``hiredis`` installed, redis-py's own C packer is kept.

A claim readied ahead of its release is packed then, and held until the release
(:meth:`Packer.holding`): what is left at the release is the send.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


class Packer:
    """Packs a command into the Redis protocol (RESP), as redis-py's
    ``PythonRespSerializer`` does, byte for byte, in one piece; ``encode`` turns each
    argument into bytes (the connection's encoder)."""

    __slots__ = ("_held", "encode")

    def __init__(self, encode: Callable[[Any], bytes]) -> None:
        self.encode = encode
        self._held = threading.local()

    @contextmanager
    def holding(self, commands: int, wait: Callable[[], None]) -> Iterator[None]:
        """Within the block, on this thread, call ``wait`` once the next ``commands``
        commands are packed: after the last one's bytes are made, before they are sent
        (redis-py sends what it packed right after packing it). Other threads sharing
        the connections pack as usual."""
        held = self._held
        held.left, held.wait = commands, wait
        try:
            yield
        finally:
            held.left, held.wait = 0, None

    def pack(self, *args: Any) -> list[bytes]:
        # A command name of several words ("CONFIG GET") is sent as separate arguments,
        # as redis-py does.
        first = args[0]
        if isinstance(first, str):
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        parts = [b"*%d\r\n" % len(args)]
        append = parts.append
        for arg in map(self.encode, args):
            append(b"$%d\r\n" % len(arg))
            append(arg)
            append(b"\r\n")
        packed = [b"".join(parts)]
        held = self._held
        left = getattr(held, "left", 0)
        if left:
            held.left = left - 1
            if left == 1:
                held.wait()
        return packed


def packer_of(client: Any) -> Packer | None:
    """The :class:`Packer` of ``client``'s connections, if :func:`use_packer` set one."""
    packer = client.connection_pool.connection_kwargs.get("command_packer")
    return packer if isinstance(packer, Packer) else None


def use_packer(driver: ModuleType, client: Any) -> None:
    """Have the connections ``client`` opens pack with :class:`Packer`, unless redis-py
    packs in C (``hiredis``) or predates packers (redis-py < 4.4, which has no
    ``command_packer``)."""
    if driver.utils.HIREDIS_AVAILABLE:
        return
    connection = getattr(driver.connection, "AbstractConnection", driver.connection.Connection)
    if "command_packer" not in inspect.signature(connection.__init__).parameters:
        return
    kwargs = client.connection_pool.connection_kwargs
    encoder = driver.connection.Encoder(
        kwargs.get("encoding", "utf-8"),
        kwargs.get("encoding_errors", "strict"),
        kwargs.get("decode_responses", False),
    )
    kwargs["command_packer"] = Packer(encoder.encode)
