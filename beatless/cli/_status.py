"""``beatless status``: what the fleet did and does, printed or served as a read-only
page (also ``celery beatless status``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
        lambda: report(store, namespace, schedule=schedule, now_ms=now_ms()),
        host=host,
        port=port,
        allow_hosts=allow_hosts,
    )
    return 0


def print_status(
    store: ClaimStore, namespace: str, *, schedule: Schedule | None, as_json: bool
) -> int:
    """Print the status of ``namespace``; 0 when healthy, 1 with problems."""
    from beatless.ops.status import render, report

    status = report(store, namespace, schedule=schedule, now_ms=now_ms())
    print(json.dumps(status, indent=2) if as_json else render(status))
    return EXIT_PROBLEMS if status["problems"] else 0
