"""A Redis broker connection whose pushes are recorded instead of sent.

kombu's Redis transport delivers a task message with ``LPUSH`` (plus ``PEXPIRE`` for a
queue with ``x-expires``, in a ``MULTI`` pipeline), and a fanout message with
``PUBLISH``. A :class:`Recorder` gives kombu a transport whose channels open redis-py
connections of a subclass that, while the recorder is on, keeps those commands and
answers them as Redis would, and sends every other command (reading an exchange's
bindings, declaring a queue) to the server as usual. The seam is redis-py's public
connection API (``send_command``, ``pack_commands``, ``send_packed_command``,
``read_response``) and kombu's ``Channel.connection_class`` attribute; nothing of
kombu's delivery code is repeated.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

Command = list[str]

RECORDED = frozenset({"LPUSH", "RPUSH", "PEXPIRE", "PUBLISH"})
"""The commands that deliver a message: kept, never sent, while recording."""
_REPLIES: dict[str, Any] = {"LPUSH": 1, "RPUSH": 1, "PEXPIRE": 1, "PUBLISH": 0}


class NotRecordable(Exception):
    """A pipeline mixed deliveries with other commands: it cannot be half recorded."""


class Recorder:
    """Records what a kombu Redis connection would push, for the duration of
    :meth:`recording`. One recorder serves one thread at a time."""

    def __init__(self) -> None:
        self.commands: list[Command] | None = None
        recorder = self

        class Connection(_Recording, redis.Connection):
            pass

        class SSLConnection(_Recording, redis.SSLConnection):
            pass

        Connection.recorder = SSLConnection.recorder = recorder
        self.connection_classes: tuple[type[Any], ...] = (Connection, SSLConnection)

        class Channel(kombu_redis.Channel):
            connection_class = Connection
            connection_class_ssl = SSLConnection

        class Transport(kombu_redis.Transport):
            pass

        Transport.Channel = Channel
        self.transport: type[Any] = Transport
        """A kombu transport class: ``Connection(url, transport=recorder.transport)``."""

    @contextmanager
    def recording(self) -> Iterator[list[Command]]:
        """Everything the connection delivers inside the block lands in the list."""
        commands: list[Command] = []
        self.commands = commands
        try:
            yield commands
        finally:
            self.commands = None

    def records(self, channel: Any) -> bool:
        """Whether ``channel``'s pushes go through this recorder (not, e.g., through a
        Unix-socket connection that kombu picks by URL)."""
        pool = getattr(channel, "pool", None)
        return getattr(pool, "connection_class", None) in self.connection_classes


class _Recording:
    """The redis-py connection half of :class:`Recorder`."""

    recorder: Recorder

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replies: collections.deque[Any] = collections.deque()
        self._held: list[Command] | None = None

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        commands = self.recorder.commands
        if commands is not None and _name(args[0]) in RECORDED:
            command = [_text(a) for a in args]
            commands.append(command)
            self._replies.append(_REPLIES[command[0].upper()])
            return
        super().send_command(*args, **kwargs)  # type: ignore[misc]

    def pack_commands(self, commands: Sequence[Sequence[Any]]) -> list[bytes]:
        if self.recorder.commands is not None and any(_name(c[0]) in RECORDED for c in commands):
            self._held = [[_text(a) for a in c] for c in commands]
            return []
        packed: list[bytes] = super().pack_commands(commands)  # type: ignore[misc]
        return packed

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        held, self._held = self._held, None
        if held is None:
            super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        recorded = self.recorder.commands
        if recorded is None:  # recording ended between packing and sending
            raise NotRecordable("the recording ended before the pipeline was sent")
        names = [c[0].upper() for c in held]
        inner = [c for c in held if c[0].upper() not in ("MULTI", "EXEC")]
        if any(c[0].upper() not in RECORDED for c in inner):
            raise NotRecordable(f"a pipeline of {names} mixes deliveries with other commands")
        recorded.extend(inner)
        for name in names:
            if name == "MULTI":
                self._replies.append(b"OK")
            elif name == "EXEC":
                self._replies.append([_REPLIES[c[0].upper()] for c in inner])
            elif "MULTI" in names:
                self._replies.append(b"QUEUED")
            else:
                self._replies.append(_REPLIES[name])

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if self._replies:
            return self._replies.popleft()
        return super().read_response(*args, **kwargs)  # type: ignore[misc]


def _name(value: Any) -> str:
    return _text(value).upper()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)
