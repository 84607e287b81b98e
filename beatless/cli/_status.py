"""``beatless status``: what the fleet did and does, printed or served as a read-only
page (also ``celery beatless status``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from beatless.cli._common import EXIT_PROBLEMS, now_ms
from beatless.cli._fleet import fleet_from_args
from beatless.schedule.entry import Schedule

if TYPE_CHECKING:
    from beatless.stores import ClaimStore


def cmd_status(args: argparse.Namespace) -> int:
    fleet = fleet_from_args(args)
    with fleet.open() as store:
        if args.serve is not None:
            return serve_status(
                store,
                fleet.namespace,
                fleet.schedule,
                args.host,
                args.serve,
                allow_hosts=args.allow_host,
            )
        return print_status(store, fleet.namespace, schedule=fleet.schedule, as_json=args.json)


def serve_status(
    store: ClaimStore,
    namespace: str,
    schedule: Schedule | None,
    host: str,
    port: int,
    *,
    allow_hosts: Sequence[str] = (),
) -> int:
    """Serve the read-only status page of ``namespace`` until SIGINT or SIGTERM."""
    from beatless.ops._page import serve
    from beatless.ops.status import report

    serve(
        SharedReport(lambda: report(store, namespace, schedule=schedule, now_ms=now_ms())),
        host=host,
        port=port,
        allow_hosts=allow_hosts,
    )
    return 0


READ_EVERY_S = 2.0
"""The status page reads the store at most this often, however many pages are open."""
READ_SHARE = 0.2
"""And spends at most this share of its time reading: a report that took 8 s to read (a
schedule of 100,000 entries) is shown for 40 s."""


class SharedReport:
    """The status page's report, read again only when the last one is older than
    ``READ_EVERY_S``, or than its own reading time over ``READ_SHARE``: each open page asks
    for it every 2 s, and ten pages open must not read the store ten times as often. The
    page server asks one request at a time; a failed read is not kept."""

    def __init__(
        self, read: Callable[[], dict[str, Any]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._read, self._clock = read, clock
        self._last: dict[str, Any] | None = None
        self._read_at = self._took = 0.0

    def __call__(self) -> dict[str, Any]:
        began = self._clock()
        if self._last is None or began - self._read_at >= self.read_every_s:
            self._last = self._read()
            self._read_at = self._clock()
            self._took = self._read_at - began
        return self._last

    @property
    def read_every_s(self) -> float:
        """How long the report last read is kept before the store is read again."""
        return max(READ_EVERY_S, self._took / READ_SHARE)


def print_status(
    store: ClaimStore, namespace: str, *, schedule: Schedule | None, as_json: bool
) -> int:
    """Print the status of ``namespace``; 0 when healthy, 1 with problems."""
    from beatless.ops.status import render, report

    status = report(store, namespace, schedule=schedule, now_ms=now_ms())
    if as_json:
        write_json(status, sys.stdout)
    else:
        print(render(status))
    return EXIT_PROBLEMS if status["problems"] else 0


def write_json(value: Any, out: TextIO, *, batch: int = 4_096) -> None:
    """``value`` as indented JSON and a newline, written a few thousand pieces at a time:
    the report of a big schedule is written as it is encoded, never held whole as text
    (100,000 entries are 90 MB of it)."""
    pieces: list[str] = []
    for piece in json.JSONEncoder(indent=2).iterencode(value):
        pieces.append(piece)
        if len(pieces) >= batch:
            out.write("".join(pieces))
            pieces.clear()
    pieces.append("\n")
    out.write("".join(pieces))
