"""``beatless run``: one standalone node that logs each firing's decision.

Environment variables (``BEATLESS_STORE``, ``BEATLESS_NODE``) are read here and in
:mod:`beatless.cli._fleet` only.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from beatless.cli._common import EXIT_PROBLEMS
from beatless.cli.loader import load_schedule
from beatless.errors import ConfigError, StoreUnavailable
from beatless.schedule.entry import Schedule

if TYPE_CHECKING:
    from beatless.stores import ClaimStore

STORE_WAIT_S = 5.0
"""How long ``run`` keeps trying a store it cannot reach at start before it gives up."""
STORE_RETRY_S = 0.25


def cmd_run(args: argparse.Namespace) -> int:
    store = args.store or os.environ.get("BEATLESS_STORE")
    if not store:
        raise ConfigError("give --store URL or set BEATLESS_STORE (e.g. sqlite:///beatless.db)")
    node = args.node or os.environ.get("BEATLESS_NODE") or None
    schedule = load_schedule(args.target)
    return run_node(
        schedule,
        store_url=store,
        node=node,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        preferred=not args.every_node_claims,
    )


def run_node(
    schedule: Schedule,
    *,
    store_url: str,
    node: str | None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    preferred: bool = True,
) -> int:
    """Run one node until SIGINT or SIGTERM, logging each firing's decision; with
    ``metrics_port``, serve its Prometheus metrics there, on ``metrics_host`` (127.0.0.1
    unless given; a port taken is an error)."""
    from beatless.node.scheduler import Scheduler
    from beatless.ops import metrics

    if metrics_host is not None and metrics_port is None:
        raise ConfigError("--metrics-host needs --metrics-port: give the port to serve on")
    if metrics_port is not None:
        metrics.metrics_port(metrics_port, "--metrics-port")  # prometheus-client, a port
        metrics_host = metrics.metrics_host(metrics_host or metrics.DEFAULT_ADDR, "--metrics-host")

    with open_probed(store_url, namespace=schedule.namespace) as store:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)  # run shows each one
        scheduler = Scheduler(  # checks rule 5 on the store
            schedule, store=store, node=node, preferred=preferred
        )
        if metrics_port is not None:
            metrics.register(scheduler)
            metrics.serve(metrics_port, addr=metrics_host or metrics.DEFAULT_ADDR)
        stopping = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopping.set())
        thread = scheduler.start()
        while thread.is_alive() and not stopping.wait(0.5):
            pass
        scheduler.stop(timeout=10)
    return 0 if stopping.is_set() else EXIT_PROBLEMS


def open_probed(url: str, *, namespace: str, wait_s: float = STORE_WAIT_S) -> ClaimStore:
    """Open the store at ``url`` for ``namespace`` and probe it before anything else.

    A store that refuses the credentials (or any error but unavailability) fails at
    once; one that cannot be reached is tried again for up to ``wait_s`` seconds, then
    :class:`~beatless.errors.StoreUnavailable` says for how long it was tried.
    """
    from beatless.stores import open_store

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _probed(open_store(url, namespace=namespace))
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"{exc} (tried for {wait_s:g} s)") from None
            time.sleep(min(STORE_RETRY_S, left))


def _probed(store: ClaimStore) -> ClaimStore:
    try:
        store.probe()
    except BaseException:
        store.close()
        raise
    return store
