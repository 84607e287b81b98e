"""The faults of ``store_faults.py``, one function per kind of row.

Each takes the row's :class:`~store_faults_fleet.Bench`, starts the servers and the
three nodes, injects its fault at an instant fixed from the schedule's anchor (1.5 s
into a fan-out), and returns what it measured as an
:class:`~store_faults_fleet.Outcome`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import postgres_server
import redis
from harness import Fleet, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer
from store_faults_fleet import (
    LEAD_S,
    MIB,
    NODES,
    WAIT_QUERY,
    WORKERS,
    Bench,
    BenchWorkers,
    Outcome,
    busiest,
    copies_nodes,
    nodes,
    refusal,
    week,
)
from test_faults_copies import count_copies, drain
from test_faults_stores import stop_fast

# -- Redis: eviction and a full store --------------------------------------------------


def admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=2)


def evicting_at_start(bench: Bench, policy: str, maxmemory_mib: int, rate: int) -> Outcome:
    """The policy and the other client's writes in place before the nodes start, as the
    issue ran it: the nodes must refuse; if they run, the run is counted."""
    store = bench.redis("store")
    writer = bench.writer(store.port, rate)
    with admin(store) as client:
        client.config_set("maxmemory", f"{maxmemory_mib}mb")
        client.config_set("maxmemory-policy", policy)
    writer.fill(used=(maxmemory_mib - 1) * MIB)
    writer.start()
    anchor, run = bench.start(week(), [store.url] * 3)
    line = refusal(run, within_s=LEAD_S + 15)
    if line is not None:
        return Outcome(refused=line)
    run.fault(f"maxmemory-policy {policy}", run.started, anchor + bench.sizes.window_s)
    return bench.finish(run, anchor)


def evicting_live(bench: Bench, policy: str, maxmemory_mib: int, rate: int) -> Outcome:
    """The policy set with ``CONFIG SET`` under the running fleet while the other client
    writes, for half the window; then set back to ``noeviction``."""
    store = bench.redis("store")
    writer = bench.writer(store.port, rate)
    anchor, run = bench.start(week(), [store.url] * 3)
    writer.fill(used=(maxmemory_mib - 1) * MIB)
    with admin(store) as client:
        sleep_until(anchor + bench.sizes.fault_at_s)
        began = time.time()
        client.config_set("maxmemory", f"{maxmemory_mib}mb")
        client.config_set("maxmemory-policy", policy)
        writer.start()
        time.sleep(bench.sizes.window_s / 2)
        evicted = int(client.info("stats")["evicted_keys"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "0")
        run.fault(f"maxmemory-policy {policy}", began, time.time())
        writer.stop()
    outcome = bench.finish(run, anchor)
    outcome.note = f"{evicted} keys evicted in {bench.sizes.window_s / 2:.0f} s"
    return outcome


def full_store(bench: Bench) -> Outcome:
    """``maxmemory 8mb``, ``noeviction``: the other client fills Redis until it refuses
    writes and keeps writing 300 KB/s for half the window, then deletes its keys."""
    store = bench.redis("store")
    with admin(store) as client:
        client.config_set("maxmemory", "8mb")
        client.config_set("maxmemory-policy", "noeviction")
    writer = bench.writer(store.port, 300_000)
    anchor, run = bench.start(week(), [store.url] * 3)
    sleep_until(anchor + bench.sizes.fault_at_s)
    began = time.time()
    writer.fill()
    writer.start()
    sleep_until(began + bench.sizes.window_s / 2)
    writer.stop()
    writer.drain()
    run.fault("redis full", began, time.time())
    outcome = bench.finish(run, anchor)
    outcome.note = f"{writer.refused} of the other client's writes refused as full"
    return outcome


# -- Redis: failover and restarts -------------------------------------------------------


def failover(bench: Bench, *, lag_s: float, moved: str, wait: bool) -> Outcome:
    """A replica lagging ``lag_s`` (its link held), the primary SIGKILLed with what the
    link held, the replica promoted; the nodes ``moved`` to it: ``restart`` (stopped and
    started again on its address) or ``proxy`` (each node's proxy pointed at it). With
    ``wait``, the URL asks ``wait=1`` and the old primary comes back as a replica."""
    store = bench.replicated()
    query = WAIT_QUERY if wait else ""
    links = [bench.proxy(store.primary.address) for _ in NODES] if moved == "proxy" else []
    urls = [link.url + query for link in links] or [store.primary.url + query] * 3
    anchor, run = bench.start(week(), urls)
    sleep_until(anchor + bench.sizes.fault_at_s)
    began = time.time()
    store.link.pause()
    time.sleep(lag_s)
    store.fail_over(links)
    if wait:
        store.rejoin()
    if moved == "restart":
        run.stop()
        run.start(run_config(run, "n0"), nodes([store.replica.url + query] * 3, suffix="r"))
    run.fault("primary killed, lagging replica promoted", began, time.time())
    return bench.finish(run, anchor)


def run_config(run: Fleet, name: str) -> dict[str, Any]:
    """The common configuration a node of ``run`` was started with (its own names left
    out), to start others like it."""
    config = json.loads((run.workdir / f"{name}.config.json").read_text())
    own = ("node", "store", "schedule", "record", "summary")
    return {key: value for key, value in config.items() if key not in own}


def restarted_empty(bench: Bench) -> Outcome:
    """The claim store's Redis SIGKILLed and started empty on its port, three times in
    the long window (90 s), each 1.5 s into a fan-out."""
    window = bench.sizes.long_window_s
    store = bench.redis("store")
    anchor = next_whole_second(LEAD_S)
    run = bench.fleet({**week(), "anchor_s": anchor})
    run.start(bench.common(anchor, window_s=window), nodes([store.url] * 3))
    for at in bench.sizes.spaced(window):
        sleep_until(anchor + at)
        began = time.time()
        store.restart()
        run.fault("store restarted empty", began, time.time())
    return bench.finish(run, anchor, window)


# -- PostgreSQL and NATS: restarts with their data --------------------------------------


def restarts(bench: Bench, url: str, restart: Callable[[], None], what: str) -> Outcome:
    """``restart()`` three times over the window, each 1.5 s into a fan-out."""
    anchor, run = bench.start(week(), [url] * 3)
    for at in bench.sizes.spaced(bench.sizes.window_s):
        sleep_until(anchor + at)
        began = time.time()
        restart()
        run.fault(what, began, time.time())
    return bench.finish(run, anchor)


def pg_url(server: postgres_server.PostgresServer, where: Proxy | None = None) -> str:
    """The store's URL on ``server`` (or through the proxy ``where``), schema ``bench``."""
    host, port = (where.host, where.port) if where else ("127.0.0.1", server.port)
    return f"postgresql://postgres@{host}:{port}/postgres?schema=beatless_bench"


def pg_restarted(bench: Bench, how: str) -> Outcome:
    """PostgreSQL (``synchronous_commit`` on) stopped (``fast``: SIGINT, as ``pg_ctl stop``;
    ``kill``: SIGKILL of the postmaster and its children), down 2 s, started again on its
    data, three times."""
    server = bench.postgres()

    def restart() -> None:
        if how == "fast":
            stop_fast(server)
        else:
            server.kill()
        time.sleep(2.0)
        server.start()

    return restarts(bench, pg_url(server), restart, f"postgres stopped ({how}), restarted")


def pg_stopped_in_fan_out(bench: Bench) -> Outcome:
    """A fan-out of 300 tenants due at once every 30 s (20 ms per send): 1 s into the
    second one PostgreSQL stops (fast shutdown) for 3.2 s and starts on its data."""
    window = max(bench.sizes.window_s, 30)
    server = bench.postgres()
    anchor = next_whole_second(LEAD_S)
    run = bench.fleet({**week(big=True), "anchor_s": anchor})
    common = bench.common(anchor, window_s=window, send_delay_s=0.02)
    run.start(common, nodes([pg_url(server)] * 3))
    sleep_until(anchor + 30 + 1.0)
    began = time.time()
    stop_fast(server)
    sleep_until(began + 3.2)
    server.start()
    run.fault("postgres stopped 3.2 s", began, time.time())
    return bench.finish(run, anchor, window)


def nats_restarted(bench: Bench) -> Outcome:
    """``nats-server -js`` SIGKILLed, down 2 s, started on the same JetStream directory,
    three times."""
    server = bench.nats()

    def restart() -> None:
        server.kill()
        time.sleep(2.0)
        server.start()

    return restarts(bench, server.url("bucket=beatless_bench"), restart, "nats restarted")


def links_paused(bench: Bench, store: str, which: str, pause_s: float) -> Outcome:
    """``which`` (``one``: the node busiest in a fan-out; ``all``) node links to the
    store held ``pause_s`` by their proxies, 1.5 s into a fan-out; real workers (their
    own links untouched) run what the nodes send."""
    if store == "postgres":
        server: Any = bench.postgres()
        address, url = ("127.0.0.1", server.port), lambda link: pg_url(server, link)
    else:
        server = bench.nats()
        address = ("127.0.0.1", server.port)
        url = lambda link: f"nats://{link.host}:{link.port}/?bucket=beatless_bench"  # noqa: E731
    broker = bench.redis("broker")
    workers = BenchWorkers(bench.workdir, broker.url)
    bench.stack.callback(workers.stop)
    for name in WORKERS:
        workers.start(name, url(bench.proxy(address)))
    links = [bench.proxy(address) for _ in NODES]
    anchor = next_whole_second(LEAD_S + 6)
    run = bench.fleet({**week(), "anchor_s": anchor})
    workers.wait_ready(timeout=anchor - time.time() - 2)
    with copies_nodes():
        run.start(bench.common(anchor, celery_broker=broker.url), nodes([url(k) for k in links]))
    sleep_until(anchor + bench.sizes.fault_at_s)
    paused = links if which == "all" else [links[busiest(run)]]
    began = time.time()
    for link in paused:
        link.pause()
    time.sleep(pause_s)
    for link in paused:
        link.resume()
    run.fault(f"{which} node link(s) paused {pause_s:.0f} s", began, time.time())
    outcome = bench.finish(run, anchor)
    drain(broker.url, time.monotonic())
    workers.stop()
    outcome.copies = count_copies(run, broker.url, workers.text())
    copies = outcome.copies
    outcome.note = (
        f"workers ran {len(copies.ran)} firings ({sum(copies.ran.values())} copies) of "
        f"{len(copies.sent)} sent; once-only verdicts {dict(copies.verdicts) or 'none logged'}"
    )
    return outcome
