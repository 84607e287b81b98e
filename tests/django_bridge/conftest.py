"""The bridge's tests run on the Django project of ``tests/django_project.py`` (the
session fixture ``django_project`` of ``tests/conftest.py``): SQLite and PostgreSQL, both
migrated once. The ``database`` fixture runs a test on each, its tables emptied first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django_project import DATABASES, chosen

pytest.importorskip("django_celery_beat", reason="the bridge needs: pip install 'beatless[django]'")


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, django_project: dict[str, str]) -> Iterator[str]:
    """Runs the test on one database, its django-celery-beat tables empty."""
    with chosen(request.param) as alias:
        yield alias
