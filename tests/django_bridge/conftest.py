"""A Django project with django-celery-beat's tables, on SQLite and on PostgreSQL.

The session migrates both databases once: SQLite in a file of its own, PostgreSQL in a
schema of its own on the shared server (dropped at the end; no other schema is touched).
The ``database`` fixture runs a test on each, its tables emptied first.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_check import require_service

pytest.importorskip("django_celery_beat", reason="the bridge needs: pip install 'beatless[django]'")

POSTGRES_URL = "postgresql://127.0.0.1:5432/test"
DATABASES = ("default", "postgres")


def _schema(schema: str, *, drop: bool) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        verb = "DROP SCHEMA IF EXISTS {} CASCADE" if drop else "CREATE SCHEMA {}"
        conn.execute(sql.SQL(verb).format(sql.Identifier(schema)))


@pytest.fixture(scope="session")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django set up on the test project; both databases migrated. Its environment, for
    the worker processes that open the same databases."""
    import django
    from django.conf import settings

    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"beatless_django_{uuid.uuid4().hex[:10]}"
    env = {
        "DJANGO_SETTINGS_MODULE": "django_settings",
        "BEATLESS_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "rows.db"),
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


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, django_project: dict[str, str]) -> Iterator[str]:
    """Runs the test on one database, its django-celery-beat tables empty."""
    import django_settings
    from django_celery_beat import models

    token = django_settings.DATABASE.set(request.param)
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
        yield request.param
    finally:
        django_settings.DATABASE.reset(token)


HERE = Path(__file__).resolve().parent
