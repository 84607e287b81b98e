"""A Celery app whose periodic tasks run on every worker, with no ``celery beat``.

Run three (or any number of) workers; each occurrence runs exactly once::

    celery -A integrations.celery_redis.app worker -n one@%h -c 1
    celery -A integrations.celery_redis.app worker -n two@%h -c 1
    celery -A integrations.celery_redis.app worker -n three@%h -c 1

Settings (read here, at the app's edge):

``BEATLESS_DEMO_BROKER``
    The broker URL: ``redis://127.0.0.1:6379/0`` by default; ``amqp://...`` for RabbitMQ.
``BEATLESS_DEMO_STORE``
    The claim store (``beatless_store_url``). Unset with a Redis broker: the broker's own
    Redis, where claim and enqueue are one script. Required with RabbitMQ.
``BEATLESS_DEMO_NAMESPACE``
    ``demo`` by default: the beatless namespace, the queue's name, and the prefix of
    every key the app writes to the broker's Redis (kombu's ``global_keyprefix``), so
    several copies can share one server.
``BEATLESS_DEMO_MAX_LATE``
    How late a firing may still be enqueued (``beatless_max_late``); ``30s`` by default.
``BEATLESS_DEMO_METRICS_PORT``, ``BEATLESS_DEMO_METRICS_HOST``
    Serve the node's Prometheus metrics on this port (``beatless_metrics_port``; needs
    the ``metrics`` extra), at this address (``beatless_metrics_host``; ``127.0.0.1`` by
    default, ``0.0.0.0`` in a container scraped from outside it). Unset: no metrics.
``BEATLESS_DEMO_RECORD``
    A Redis URL: each run is appended to the list ``{namespace}:runs`` there as one JSON
    object (the end-to-end tests read it). Unset: runs are only logged.
"""

from __future__ import annotations

import logging
import os

from celery import Celery

import beatless.celery
from integrations.celery_redis.schedule import BEAT_SCHEDULE

BROKER_URL = os.environ.get("BEATLESS_DEMO_BROKER", "redis://127.0.0.1:6379/0")
NAMESPACE = os.environ.get("BEATLESS_DEMO_NAMESPACE", "demo")

# Each firing's decision (won, lost, ...) on its own DEBUG logger: shown here, per firing.
logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)

app = Celery(NAMESPACE, include=["integrations.celery_redis.tasks"])
app.conf.update(
    broker_url=BROKER_URL,
    broker_transport_options={"global_keyprefix": f"{NAMESPACE}:"},
    broker_connection_retry_on_startup=True,
    task_default_queue=NAMESPACE,
    timezone="UTC",
    # A task is acknowledged when it ends, and given back if its worker process dies.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    beat_schedule=BEAT_SCHEDULE,
    beatless_namespace=NAMESPACE,
    beatless_max_late=os.environ.get("BEATLESS_DEMO_MAX_LATE", "30s"),
    beatless_lease=os.environ.get("BEATLESS_DEMO_LEASE", "30s"),
)
if os.environ.get("BEATLESS_DEMO_STORE"):
    app.conf.beatless_store_url = os.environ["BEATLESS_DEMO_STORE"]
if os.environ.get("BEATLESS_DEMO_METRICS_PORT"):
    app.conf.beatless_metrics_port = os.environ["BEATLESS_DEMO_METRICS_PORT"]
    app.conf.beatless_metrics_host = os.environ.get("BEATLESS_DEMO_METRICS_HOST", "127.0.0.1")

# The one line: a beatless scheduler in every worker. Remove it to roll back to beat.
beatless.celery.install(app)
