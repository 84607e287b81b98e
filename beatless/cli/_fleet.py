"""The fleet a command addresses: its namespace, its schedule when known, and its claim
store, named by a schedule, a Celery app, a Dramatiq broker or a store URL."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from beatless.cli.loader import load_schedule
from beatless.errors import BeatlessError, ConfigError
from beatless.schedule.entry import Entry, Schedule

if TYPE_CHECKING:
    from beatless.stores import ClaimStore


@dataclass(frozen=True)
class Fleet:
    """What a command addresses: a namespace, its schedule when known, and how to open its
    claim store, always by :func:`~beatless.stores.open_store` with that namespace (or by
    the integration, which opens it the same way), so every command and every node of
    the fleet address the same keys."""

    namespace: str
    schedule: Schedule | None
    opener: Callable[[], ClaimStore] | None
    """``None`` when no store is named."""
    app: Any = None
    """The Celery app, when the fleet is named by ``--celery``."""

    @property
    def has_store(self) -> bool:
        return self.opener is not None

    def open(self) -> ClaimStore:
        if self.opener is None:
            raise ConfigError(
                "give --store URL (or BEATLESS_STORE), --celery APP or --dramatiq BROKER: "
                "this command reads the fleet's claim store"
            )
        return self.opener()

    def known_schedule(self) -> Schedule:
        """The schedule, else the entries the fleet's nodes publish in its store."""
        if self.schedule is not None:
            return self.schedule
        with self.open() as store:
            return published_schedule(store, self.namespace)


def fleet_from_args(args: argparse.Namespace) -> Fleet:
    """The fleet named by TARGET (or ``--schedule``), ``--celery``, ``--dramatiq`` or
    ``--store`` with ``--namespace``: one of the first three, or the store alone.

    The namespace is the schedule's or the app's: a ``--namespace`` that differs is
    refused rather than followed, so no command writes where no node reads."""
    url = args.store or os.environ.get("BEATLESS_STORE") or None
    target = args.target or getattr(args, "schedule", None)
    if sum(map(bool, (target, args.celery, args.dramatiq))) > 1:
        raise ConfigError("give one of TARGET, --celery APP or --dramatiq BROKER, not two")
    if args.celery:
        fleet = celery_fleet(_load_celery(args.celery), url)
    elif args.dramatiq:
        fleet = _dramatiq_fleet(args.dramatiq, url)
    elif target:
        schedule = load_schedule(target)
        fleet = Fleet(schedule.namespace, schedule, _opener(url, schedule.namespace))
    elif not url:
        raise ConfigError(
            "give TARGET, --celery APP, --dramatiq BROKER, or --store URL (or BEATLESS_STORE) "
            "with --namespace NS"
        )
    elif not args.namespace:
        raise ConfigError(
            "give --namespace NS with --store: the fleet's namespace (beatless_namespace of a "
            "Celery app, Beatless(namespace=...) of Dramatiq, a schedule's namespace)"
        )
    else:
        return Fleet(args.namespace, None, _opener(url, args.namespace))
    if args.namespace and args.namespace != fleet.namespace:
        raise ConfigError(
            f"--namespace {args.namespace!r} is not the fleet's namespace {fleet.namespace!r}: "
            "drop --namespace"
        )
    return fleet


def _opener(url: str | None, namespace: str) -> Callable[[], ClaimStore] | None:
    from beatless.stores import open_store

    return None if url is None else partial(open_store, url, namespace=namespace)


def _load_celery(name: str) -> Any:
    from beatless.cli._app_check import load_celery

    return load_celery(name)


def celery_fleet(app: Any, url: str | None = None) -> Fleet:
    """A Celery app's fleet: its namespace, its schedule (``None`` with problems) and its
    claim store (``beatless_store_url``, or ``url``)."""
    from beatless.celery._schedule import check_app, open_claim_store
    from beatless.celery._settings import CelerySettings

    settings = CelerySettings.from_app(app)
    schedule = check_app(app, settings).schedule
    return Fleet(settings.namespace, schedule, partial(open_claim_store, settings, url), app)


def _dramatiq_fleet(names: Sequence[str], url: str | None) -> Fleet:
    """A Dramatiq broker's fleet, from its Beatless middleware."""
    from beatless.cli._app_check import load_dramatiq

    broker, middleware = load_dramatiq(names[0], names[1:])
    schedule = middleware.check(broker).schedule
    namespace = middleware.address_namespace
    if url:
        return Fleet(namespace, schedule, _opener(url, namespace))
    return Fleet(namespace, schedule, partial(middleware.status_store, broker))


def published_schedule(store: ClaimStore, namespace: str) -> Schedule:
    """The schedule as the live nodes of ``namespace`` publish it in ``store``: each
    entry's task, trigger, window, jitter, max_late, catch_up, overlap and listed tenants
    (a fan-out's first 20). What is not published (arguments, run leases, once_only) takes
    its default; ``check`` with the schedule itself tells those."""
    from beatless.fleet._notes import entries_kind, trigger_of

    kind = entries_kind(namespace)
    entries = []
    for text in store.read_notes([kind])[kind].values():
        try:
            note = json.loads(text)
            trigger = trigger_of(note["trigger"])
            tenants = note.get("tenants")
            if trigger is None:
                continue
            entries.append(
                Entry(
                    name=note["entry"],
                    task=note["task"],
                    trigger=trigger,
                    jitter=timedelta(milliseconds=int(note["jitter_ms"])),
                    max_late=timedelta(milliseconds=int(note["max_late_ms"])),
                    tenants=None
                    if tenants is None
                    else tenants
                    if isinstance(tenants, list)
                    else (),
                    catch_up=note.get("catch_up", "latest"),
                    overlap=note.get("overlap", "allow"),
                    start_at=note.get("start_ms"),
                    end_at=note.get("end_ms"),
                    enabled=note.get("enabled", True),
                )
            )
        except (ValueError, KeyError, TypeError, BeatlessError):
            continue  # a note this version cannot read: the entry is left out
    if not entries:
        raise ConfigError(
            f"no node of namespace {namespace!r} has published its entries in this store "
            "(is the namespace right, and a node running?): give TARGET, --celery APP or "
            "--dramatiq BROKER"
        )
    print(
        f"note: the entries of namespace {namespace!r} as its nodes publish them in the store",
        file=sys.stderr,
    )
    return Schedule(sorted(entries, key=lambda e: e.name), namespace=namespace)
