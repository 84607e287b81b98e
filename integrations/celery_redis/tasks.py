"""The example's tasks: each notes which firing it runs and where.

A task reads its firing from its request: the task id is the firing id, and
``beatless.celery.occurrence(self.request)`` is the nominal occurrence (with a jitter
window the task runs after it). Under stock ``celery beat`` both are ``None``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import beatless.celery
from integrations.celery_redis.app import NAMESPACE, app

logger = logging.getLogger(__name__)

RECORD_URL = os.environ.get("BEATLESS_DEMO_RECORD")
_recorder: Any = None


def record(task: Any, **fields: Any) -> None:
    """Note one run as it starts: task, task id, occurrence, tenant, worker."""
    global _recorder  # noqa: PLW0603 - one client per process, made on first use
    request = task.request
    when = beatless.celery.occurrence(request)
    row = {
        "task": task.name,
        "id": request.id,
        "firing_id": beatless.celery.task_firing_id(request),
        "occurrence": None if when is None else when.isoformat(),
        "occurrence_ms": None if when is None else round(when.timestamp() * 1000),
        "address": getattr(request, "beatless_address", None),
        "tenant": beatless.celery.tenant(request),
        "args": list(request.args or ()),
        "kwargs": dict(request.kwargs or {}),
        "worker": request.hostname,
        "pid": os.getpid(),
        "delivery_tag": (request.delivery_info or {}).get("delivery_tag"),
        "started_at": time.time(),
    }
    if RECORD_URL is None:
        logger.info("ran %s", row)
        return
    if _recorder is None:
        import redis

        _recorder = redis.Redis.from_url(RECORD_URL)
    _recorder.rpush(f"{NAMESPACE}:runs", json.dumps(row))


@app.task(bind=True, name="demo.tick")
def tick(self: Any, *args: Any) -> None:
    record(self)


@app.task(bind=True, name="demo.work")
def work(self: Any, size: int = 1) -> None:
    record(self)


@app.task(bind=True, name="demo.report")
def report(self: Any) -> None:
    record(self)


@app.task(bind=True, name="demo.sync_tenant")
def sync_tenant(self: Any) -> None:
    """A fan-out firing: the tenant is the last part of the firing's address."""
    record(self)
