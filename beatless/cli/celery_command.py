"""``celery -A proj beatless status``: the fleet's status, with the store and namespace of
the app (registered through Celery's ``celery.commands`` entry point). The same command
as ``beatless status --celery proj``, page included (``--serve PORT``)."""

from __future__ import annotations

import sys
from typing import Any

from beatless.errors import BeatlessError


def __getattr__(name: str) -> Any:
    """``beatless``, the click group Celery's ``celery.commands`` entry point names, built
    when Celery first asks for it: so that importing this module imports neither Celery
    nor click (only the ``celery`` command that loads it does)."""
    if name != "beatless":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    group = _build()
    globals()["beatless"] = group
    return group


def _build() -> Any:
    """The ``beatless`` group of Celery sub-commands, with its ``status`` command."""
    import click
    from celery.bin.base import CeleryCommand, handle_preload_options

    @click.group(name="beatless", help="beatless: the fleet's status, read from the claim store.")
    def beatless() -> None:
        """The ``beatless`` group of Celery sub-commands."""

    @beatless.command(cls=CeleryCommand)
    @click.option("--json", "as_json", is_flag=True, help="one JSON object")
    @click.option("--store", metavar="URL", help="another claim store than beatless_store_url")
    @click.option(
        "--serve", type=int, metavar="PORT", help="serve a read-only status page on this port"
    )
    @click.option(
        "--host",
        default="127.0.0.1",
        show_default=True,
        help="the address the page listens on",
    )
    @click.option(
        "--allow-host",
        "allow_hosts",
        multiple=True,
        metavar="NAME",
        help="a host name the page answers to besides localhost and IP addresses (repeatable)",
    )
    @click.pass_context
    @handle_preload_options  # type: ignore[untyped-decorator]
    def status(
        ctx: Any,
        *,
        as_json: bool,
        store: str | None,
        serve: int | None,
        host: str,
        allow_hosts: tuple[str, ...],
    ) -> None:
        """What the fleet did and does: live nodes, drift, each entry's last and next
        firings, missed firings. Exit 0 when healthy, 1 with problems, 2 on an error."""
        from beatless.cli._common import EXIT_BAD_INPUT
        from beatless.cli._fleet import celery_fleet
        from beatless.cli._status import print_status, serve_status

        try:
            fleet = celery_fleet(ctx.obj.app, store)
            with fleet.open() as opened:
                if serve is not None:
                    code = serve_status(
                        opened,
                        fleet.namespace,
                        fleet.schedule,
                        host,
                        serve,
                        allow_hosts=allow_hosts,
                    )
                else:
                    code = print_status(
                        opened, fleet.namespace, schedule=fleet.schedule, as_json=as_json
                    )
        except BeatlessError as exc:
            click.echo(f"celery beatless status: error: {' '.join(str(exc).split())}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        sys.exit(code)

    return beatless
