"""The Django project of the django-celery-beat bridge tests (:mod:`django_settings`), set
up once per test process: SQLite in a file of its own, PostgreSQL in a schema of its own on
the shared server (dropped at the end; no other schema is touched).

``tests/conftest.py`` makes it the session fixture ``django_project``, which the bridge's
tests (``tests/django_bridge/``) and the fault test of its rows (``tests/faults/``) share:
Django is set up once per process, so there is one project per process.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service_check import require_service

POSTGRES_URL = "postgresql://127.0.0.1:5432/test"
DATABASES = ("default", "postgres")


def _schema(schema: str, *, drop: bool) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        verb = "DROP SCHEMA IF EXISTS {} CASCADE" if drop else "CREATE SCHEMA {}"
        conn.execute(sql.SQL(verb).format(sql.Identifier(schema)))


@contextlib.contextmanager
def project(directory: Path) -> Iterator[dict[str, str]]:
    """Django set up on the test project, both databases migrated (SQLite in
    ``directory``); yields its environment, for the processes that open the same
    databases. The schema is dropped at the end."""
    import django
    from django.conf import settings

    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"beatless_django_{uuid.uuid4().hex[:10]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "django_settings",
        "BEATLESS_DJANGO_SQLITE": str(directory / "rows.db"),
        "BEATLESS_DJANGO_SCHEMA": schema,
    }
    _schema(schema, drop=False)
    try:
        if not settings.configured:
            # The settings module reads its environment once, here; the environment is
            # put back at once, so that no other test's subprocess inherits Django.
            before = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            try:
                django.setup()
            finally:
                for name, value in before.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
        from django.core.management import call_command

        for alias in DATABASES:
            call_command("migrate", database=alias, verbosity=0)
        yield env
    finally:
        from django.db import connections

        connections.close_all()
        _schema(schema, drop=True)


@contextlib.contextmanager
def chosen(alias: str) -> Iterator[str]:
    """Every query of this process (without an explicit ``using``) on the database
    ``alias``, its django-celery-beat tables emptied first."""
    import django_settings
    from django_celery_beat import models

    token = django_settings.DATABASE.set(alias)
    try:
        for model in (
            models.PeriodicTask,
            models.PeriodicTasks,
            models.CrontabSchedule,
            models.IntervalSchedule,
            models.ClockedSchedule,
            models.SolarSchedule,
        ):
            model.objects.all().delete()
        yield alias
    finally:
        django_settings.DATABASE.reset(token)


class AfterRead:
    """django-celery-beat's rows (:class:`beatless.django.DjangoRows`) that call ``then()``
    after each read of rows (not after the probe): what happens between a poll's read and
    its publish, while it is slow or its node frozen."""

    def __init__(self, rows: Any, then: Callable[[], object]) -> None:
        self.rows = rows
        self.then = then

    def probe(self) -> Any:
        return self.rows.probe()

    def changed_since(self, instant: Any) -> Any:
        return self._after(self.rows.changed_since(instant))

    def by_ids(self, ids: Any) -> Any:
        return self._after(self.rows.by_ids(ids))

    def all(self) -> Any:
        return self._after(self.rows.all())

    def close(self) -> None:
        self.rows.close()

    def _after(self, found: Any) -> Any:
        self.then()
        return found
