"""The Celery app of ``store_faults.py``'s real workers: ``tests/faults/copies_app`` with
a task for every entry of the bench's schedules.

``celery -A store_faults_worker worker`` (run by the bench, with ``tests/faults`` on the
path) consumes the private Redis broker at ``BENCH_FAULTS_BROKER``, checks each firing
once-only in the claim store at ``BENCH_FAULTS_STORE`` and notes every run it lets
through, as the workers of ``tests/faults/test_faults_copies.py`` do.
"""

from __future__ import annotations

import os

import copies_app

TASKS = ("faults.tick", "faults.tock", "faults.fan_a", "faults.fan_b", "faults.fan_big")
"""``faults.{entry}`` for every entry ``store_faults.py`` schedules."""

copies_app.TASKS = TASKS
app = copies_app.worker_app(os.environ["BENCH_FAULTS_BROKER"], os.environ["BENCH_FAULTS_STORE"])
