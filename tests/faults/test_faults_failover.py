"""A Redis primary killed and a lagging replica promoted, under three running nodes.

Three ``fault_node`` processes on the two-phase path reach the claim store each through
a TCP proxy of its own (``proxy``), as through a Sentinel-aware proxy or a virtual IP.
The store is a private primary with a replica (``redis_server``) that replicates it
through another proxy. The fault: that link is paused for ``LAG_S`` (the replica lags
while the primary grants claims), and so is one node's link (a node cut off from the
primary meanwhile: it has not yet claimed the firings the others send); then the primary
is killed (SIGKILL), the links cut with what they held (the replica never gets those
claims), the replica promoted (``REPLICAOF NO ONE``) and the nodes' proxies pointed at
it. The cut-off node then claims, on the new primary, firings the others sent during the
lag. Counted from the nodes' records: firings sent twice, misses (reported or not),
stale and early sends.

Without ``wait`` the promoted replica lacks the claims of the lag: the nodes must not
send those firings again (the failover is a change of the store's identity), and report
as forgotten whatever they cannot judge: 0 sent twice, 0 unreported misses. With
``?wait=1`` a claim counts as won only once the replica has it, and the old primary comes
back as a replica of the new one (a claim must wait for one): 0 sent twice, 0 missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Fleet, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer
from test_faults import GRACE_S, NODES, assert_clean, every, fanout, schedule

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]

LAG_S = 4
"""How long the replica lags before the primary dies (the issue measured 1 to 6 s)."""


class Replicated:
    """A private primary, and a replica that replicates it through a proxy (``link``)."""

    def __init__(self, workdir: Path, proxy: ProxyFactory) -> None:
        self.primary = RedisServer(workdir / "primary", "primary").start()
        self.link = proxy(self.primary.address)
        self.replica = RedisServer(
            workdir / "replica", "replica", replica_of=(self.link.host, self.link.port)
        )
        self.replica.start()
        self.replica.wait_in_sync()

    def fail_over(self, nodes: list[Proxy]) -> None:
        """Kill the primary with what the lagging link holds, promote the replica and
        point the ``nodes``' links at it."""
        self.primary.kill()
        self.link.drop()
        self.replica.promote()
        for link in nodes:
            link.drop()
            link.target = self.replica.address
            link.resume()

    def rejoin(self) -> None:
        """The old primary back, empty, as a replica of the promoted one."""
        self.primary.replica_of = self.replica.address
        self.primary.start()
        self.primary.wait_in_sync()

    def kill(self) -> None:
        self.primary.kill()
        self.replica.kill()


def failover_scenario(
    tmp_path: Path, proxy: ProxyFactory, fleet: FleetFactory, *, query: str, rejoin: bool
) -> Any:
    """Run the scenario; the nodes reach the store at the proxy's URL plus ``query``."""
    store = Replicated(tmp_path / "store", proxy)
    try:
        links = [proxy(store.primary.address) for _ in NODES]
        anchor = next_whole_second(8)
        run = fleet(
            schedule(
                anchor,
                every("tick", 1, 20),
                every("tock", 2, 20),
                fanout(10, jitter_s=3, max_late_s=20, tenants=40),
            )
        )
        until = anchor + 20 + 3 + 20 + GRACE_S
        nodes = [{**n, "store": link.url + query} for n, link in zip(NODES, links, strict=True)]
        run.start({"send_delay_s": 0.01, "lease_s": 10, "until": until}, nodes)
        sleep_until(anchor + 4)
        lagging = time.time()
        store.link.pause()
        links[-1].pause()
        time.sleep(LAG_S)
        store.fail_over(links)
        if rejoin:
            store.rejoin()
        run.fault("primary killed, lagging replica promoted", lagging, time.time())
        print(f"failed over after a lag of {LAG_S}s; nodes moved {time.time() - lagging:.1f}s in")
        run.wait(timeout=until - time.time() + 30)
        return run.report((anchor, anchor + 20))
    finally:
        store.kill()


def test_failover_to_a_lagging_replica_never_sends_a_firing_twice(
    tmp_path: Path, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    report = failover_scenario(tmp_path, proxy, fleet, query="", rejoin=False)
    assert report.duplicates == 0, report.details()
    assert_clean(report, misses="reported")


def test_failover_with_wait_loses_nothing(
    tmp_path: Path, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    report = failover_scenario(
        tmp_path, proxy, fleet, query="?wait=1&wait_timeout=500ms", rejoin=True
    )
    assert report.duplicates == 0, report.details()
    assert_clean(report, misses="none")
