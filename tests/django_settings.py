"""The Django project of the django-celery-beat bridge tests: two databases, one chosen.

``default`` is SQLite in the file ``BEATLESS_DJANGO_SQLITE``; ``postgres`` is the shared
PostgreSQL server (127.0.0.1:5432, trust, database ``test``; another port, a proxy's, with
``BEATLESS_DJANGO_PG_PORT``) in the schema ``BEATLESS_DJANGO_SCHEMA`` of the test session
alone. :class:`Chosen` routes every
query without an explicit ``using`` to :data:`DATABASE`: the one a test (or a worker
process, through ``BEATLESS_DJANGO_DB``) works on, so that django-celery-beat's own
signals write where its rows are.
"""

from __future__ import annotations

import os
import tempfile
from contextvars import ContextVar
from pathlib import Path
from typing import Any

SECRET_KEY = "beatless-tests-only"  # noqa: S105 - a test project, never served
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_celery_beat",
]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(
            "BEATLESS_DJANGO_SQLITE", str(Path(tempfile.gettempdir()) / "beatless-django.db")
        ),
        # The test's edits share the file with the nodes' polls: on a loaded machine a
        # write can wait past SQLite's default 5 s for their locks ("database is locked").
        "OPTIONS": {"timeout": 30},
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("BEATLESS_DJANGO_PG_PORT", "5432"),
        "OPTIONS": {
            "options": f"-c search_path={os.environ.get('BEATLESS_DJANGO_SCHEMA', 'public')}"
        },
    },
}
DATABASE_ROUTERS = ["django_settings.Chosen"]
_CHOSEN = os.environ.get("BEATLESS_DJANGO_DB", "default")
DATABASE: ContextVar[str] = ContextVar("DATABASE", default=_CHOSEN)
"""The database of the current test or process."""


class Chosen:
    """Every model on the chosen database (:data:`DATABASE`)."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return DATABASE.get()

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return DATABASE.get()

    def allow_relation(self, a: Any, b: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True
