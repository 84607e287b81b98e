"""The django-celery-beat bridge's work per poll among many rows.

    python bench/django_bridge.py                         # SQLite, 10,000 rows
    python bench/django_bridge.py --postgres --rows 1000 10000
    python bench/django_bridge.py --quick                 # 500 rows: a smoke run

For each count of ``--rows``: that many ``PeriodicTask`` rows (interval rows, created in
bulk) in a Django database of its own (SQLite in a temporary file, or a schema of its own
on the PostgreSQL server of ``--postgres-url``, dropped at the end), published by a
:class:`~beatless.django.Bridge` into a memory claim store, then timed (medians of
``--repeat``):

* **first poll**: every row read, mapped and written as one revision (a node's first);
* **idle poll**: the three markers read, nothing changed (every second on one node);
* **one edit**: one row changed through ``save()``, then the poll that reads and
  publishes it (the work of one change: the goal is that it does not grow with rows);
* **full pass**: every row read and compared, nothing changed (every 60 s on one node).

It prints one line per count, and ``--json`` the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

POSTGRES_URL = "postgresql://127.0.0.1:5432/test"


def setup_django(postgres: bool, schema: str, folder: Path) -> None:
    import django
    from django.conf import settings

    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(folder / "rows.db"),
    }
    if postgres:
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "OPTIONS": {"options": f"-c search_path={schema}"},
        }
    settings.configure(
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django.contrib.contenttypes", "django_celery_beat"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def schema_sql(verb: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL(verb).format(sql.Identifier(schema)))


def timed(action: Callable[[], Any]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def measure(rows: int, repeat: int) -> dict[str, Any]:
    from celery import Celery
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    from beatless.celery._settings import CelerySettings
    from beatless.django import Bridge, DjangoRows
    from beatless.live import Live
    from beatless.stores.memory import MemoryStore

    PeriodicTask.objects.all().delete()
    every = IntervalSchedule.objects.get_or_create(every=60, period="seconds")[0]
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"row-{i}", task="proj.report", interval=every, args=f"[{i}]")
        for i in range(rows)
    )
    PeriodicTasks.update_changed()
    app = Celery("bench", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url="memory://")
    live = Live(MemoryStore(), namespace="bench", owner="django", writer="bench")
    bridge = Bridge(live, DjangoRows(), CelerySettings.from_app(app))
    first = timed(bridge.poll)
    idle = [timed(bridge.poll) for _ in range(repeat)]
    edits = []
    for n in range(repeat):
        row = PeriodicTask.objects.get(name=f"row-{n % rows}")
        row.args = f"[{n}, {rows}]"
        row.save()
        edits.append(timed(bridge.poll))
    full = [timed(lambda: bridge.poll(full=True)) for _ in range(max(1, repeat // 4))]
    assert len(live.state()) == rows
    return {
        "rows": rows,
        "first_poll_s": round(first, 3),
        "idle_poll_ms": round(statistics.median(idle) * 1_000, 2),
        "one_edit_ms": round(statistics.median(edits) * 1_000, 2),
        "full_pass_s": round(statistics.median(full), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--quick", action="store_true", help="500 rows, 5 repeats")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat = [500], 5
    schema = f"beatless_bench_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as folder:
        if args.postgres:
            schema_sql("CREATE SCHEMA {}", schema)
        try:
            setup_django(args.postgres, schema, Path(folder))
            results = [measure(rows, args.repeat) for rows in args.rows]
        finally:
            if args.postgres:
                from django.db import connections

                connections.close_all()
                schema_sql("DROP SCHEMA IF EXISTS {} CASCADE", schema)
    where = "PostgreSQL" if args.postgres else "SQLite"
    for found in results:
        print(
            f"{where} {found['rows']:>7,} rows: first poll {found['first_poll_s']} s, idle poll "
            f"{found['idle_poll_ms']} ms, one edit {found['one_edit_ms']} ms, full pass "
            f"{found['full_pass_s']} s"
        )
    if args.json:
        print(json.dumps({"database": where, "results": results}))


if __name__ == "__main__":
    main()
