"""Prometheus metrics of Celery nodes: ``beatless_metrics_port`` and
``beatless_metrics_registry``, read as settings, exported by the beat scheduler in
process and served over HTTP by a real worker."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from celery import Celery
from conftest import CeleryProject

pytest.importorskip("prometheus_client", reason="the metrics need the 'metrics' extra")

from prometheus_client import CollectorRegistry
from scrape import won_samples
from stores import free_port

from beatless.celery import BeatScheduler, CelerySettings
from beatless.errors import ScheduleError


def memory_app(**conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={"tick": {"task": "proj.tick", "schedule": 1.0}},
        beatless_store_url="memory://",
        beatless_namespace=f"ns-{uuid.uuid4().hex[:8]}",
        **conf,
    )
    return app


def test_metrics_settings_are_read_and_checked_with_the_others() -> None:
    registry = CollectorRegistry()
    settings = CelerySettings.from_app(
        memory_app(beatless_metrics_port="9808", beatless_metrics_registry=registry)
    )
    assert settings.metrics_port == 9808
    assert settings.metrics_registry is registry
    assert settings.metrics_host == "127.0.0.1"  # this host only, as the status page
    assert CelerySettings.from_app(memory_app()).metrics_port is None
    exposed = CelerySettings.from_app(memory_app(beatless_metrics_host="10.0.0.5"))
    assert exposed.metrics_host == "10.0.0.5"

    with pytest.raises(ScheduleError) as refused:
        CelerySettings.from_app(
            memory_app(
                beatless_metrics_port=True,
                beatless_metrics_registry="registry",
                beatless_metrics_host="",
            )
        )
    assert "beatless_metrics_port must be a TCP port (1 to 65535), got True" in str(refused.value)
    assert "beatless_metrics_registry must be a prometheus_client CollectorRegistry" in str(
        refused.value
    )
    assert "beatless_metrics_host must be an address of this host" in str(refused.value)


def test_the_beat_scheduler_exports_its_node_until_it_closes() -> None:
    registry = CollectorRegistry()
    app = memory_app(beatless_metrics_registry=registry)
    beat = BeatScheduler(app=app)
    assert beat.beatless is not None
    labels = {"namespace": app.conf.beatless_namespace, "node": beat.beatless.node}
    try:
        deadline = time.monotonic() + 5
        won = None
        while time.monotonic() < deadline and not won:
            beat.tick()
            won = registry.get_sample_value(
                "beatless_firings_total", {**labels, "entry": "tick", "outcome": "won"}
            )
            time.sleep(0.05)
        assert won
        assert registry.get_sample_value("beatless_loop_alive", labels) == 1
    finally:
        beat.close()
    assert registry.get_sample_value("beatless_loop_alive", labels) is None


@pytest.mark.slow
def test_a_worker_serves_its_metrics_on_the_port_it_is_given(project: CeleryProject) -> None:
    port = free_port()
    project.configure(
        {"tick": {"task": "beatless_test.record", "schedule": 1.0}}, beatless_metrics_port=port
    )
    worker = project.worker("w1", "-P", "solo", install=True)
    won: dict[str, float] = {}

    def scraped() -> bool:
        for sample in won_samples(port) or ():
            won[sample.labels["node"]] = sample.value
            assert sample.labels["namespace"] == project.prefix
            assert sample.labels["entry"] == "tick"
        return any(value > 0 for value in won.values())

    try:
        assert project.wait_for(scraped, 60, interval=0.5), (won, worker.output())
        assert [node.split("@")[0] for node in won] == ["w1"]
    finally:
        code = worker.stop()
    assert code == 0, worker.output()
    assert f"beatless metrics on http://127.0.0.1:{port}/metrics" in worker.output()
