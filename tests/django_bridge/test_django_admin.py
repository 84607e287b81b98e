"""The admin's "Run selected tasks" through run-now: a control in the store, not a message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beatless.celery._settings import CelerySettings
from beatless.django import Bridge, DjangoRows
from beatless.fleet._controls import read_requests, run_now_kind
from beatless.live import Live
from beatless.stores import open_store


class Messages:
    """What the admin told the user."""

    def __init__(self) -> None:
        self.said: list[tuple[int, str]] = []

    def add(self, level: int, message: str, extra_tags: str = "") -> None:
        self.said.append((level, str(message)))


@pytest.fixture
def app(tmp_path: Path) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url=f"sqlite:///{tmp_path / 'claims.db'}")
    return app


def test_run_selected_tasks_queues_a_run_now_of_each_scheduled_row(
    database: str, app: Celery
) -> None:
    from django.contrib import admin, messages
    from django.test import RequestFactory
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, SolarSchedule

    from beatless.django.admin import PeriodicTaskAdmin

    pytest.importorskip("ephem")  # the solar row is scheduled with it
    every = IntervalSchedule.objects.create(every=10, period="seconds")
    PeriodicTask.objects.create(name="report", task="proj.report", interval=every)
    solar = SolarSchedule.objects.create(event="sunset", latitude=1, longitude=1)
    PeriodicTask.objects.create(name="dusk", task="proj.report", solar=solar)
    PeriodicTask.objects.create(name="odd", task="proj.report", interval=every, args="[1,")
    settings = CelerySettings.from_app(app)
    store = open_store(settings.store_url, namespace="proj")
    sent: list[Any] = []
    app.send_task = lambda *a, **k: sent.append((a, k))  # type: ignore[method-assign]
    try:
        live = Live(store, namespace="proj", owner="django")
        Bridge(live, DjangoRows(), settings).poll()
        model_admin = PeriodicTaskAdmin(PeriodicTask, admin.site)
        model_admin.celery_app = app
        request = RequestFactory().post("/")
        request._messages = Messages()
        model_admin.run_tasks(request, PeriodicTask.objects.order_by("name"))
        kind = run_now_kind("proj")
        queued = read_requests(store.read_notes([kind])[kind], "proj").values()
        assert sorted(c.entry for c in queued) == ["dusk", "report"]  # a solar row too
        said = request._messages.said
        assert said[0][0] == messages.INFO
        assert "2 tasks queued to run once" in said[0][1]
        assert said[1] == (
            messages.ERROR,
            "not run, not scheduled by beatless (see the workers' warnings): odd",
        )
        assert sent == []  # no message from the web process
    finally:
        store.close()
