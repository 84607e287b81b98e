"""The Celery app of the copies scenarios: real workers that run what the nodes send.

A ``celery worker --without-beatless`` of this app schedules nothing: it consumes the
queue :data:`QUEUE` of a private Redis broker and checks each beatless firing's task in
the claim store before its body runs (``install(app)``: the once-only check of
``beatless.celery._gate``). Each run that passes the check appends one JSON line to the
Redis list :data:`RUNS` of that broker: the task id (the firing id), the worker and when.

The environment says where: ``COPIES_BROKER`` (the private Redis), ``COPIES_STORE`` (the
claim store, as the nodes reach it, or through a link of the worker's own).
``copies_node`` sends with :func:`sending_app`: the same queue, the same task names.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery

import beatless.celery

QUEUE = "faults"
RUNS = "copies:runs"
NAMESPACE = "faults"
"""The schedule's namespace (``fault_node.build_schedule``): the once-only records of the
workers live under it, beside the nodes' claims."""
TASKS = ("faults.tick", "faults.fanout")
"""The task of each entry of the scenarios' schedules: ``faults.{entry name}``."""


def sending_app(broker: str) -> Celery:
    """An app that sends to the workers' queue (a node's)."""
    app = Celery(NAMESPACE, broker=broker, set_as_current=False)
    app.conf.task_default_queue = QUEUE
    return app


def worker_app(broker: str, store: str) -> Celery:
    """The workers' app: the claim store at ``store``, a task per entry that notes its run."""
    app = Celery(NAMESPACE, broker=broker)
    app.conf.update(
        task_default_queue=QUEUE,
        beatless_store_url=store,
        beatless_namespace=NAMESPACE,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )
    beatless.celery.install(app)
    runs = redis.Redis.from_url(broker)
    where = f"{socket.gethostname()}:{os.getpid()}"

    def note_run(task: Any) -> None:
        request = task.request
        line = {"id": request.id, "worker": request.hostname or where, "at": time.time()}
        runs.rpush(RUNS, json.dumps(line))

    def run(task: Any, *_args: Any, **_kwargs: Any) -> None:
        note_run(task)

    for name in TASKS:
        app.task(name=name, bind=True)(run)
    return app


if os.environ.get("COPIES_BROKER"):
    app = worker_app(os.environ["COPIES_BROKER"], os.environ["COPIES_STORE"])
