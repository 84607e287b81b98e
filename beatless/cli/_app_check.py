"""Load a Celery app or a Dramatiq broker by name and check its schedule, for
``beatless check --celery`` and ``beatless check --dramatiq``.

Both run the collection a node runs at start (:mod:`beatless.schedule.problems`), so CI finds
what a node would refuse. Nothing connects to a broker or a store. A name that cannot be
loaded is a :class:`~beatless.errors.ConfigError` (the command exits 2).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from beatless.errors import ConfigError
from beatless.schedule.problems import Checked

if TYPE_CHECKING:
    from dramatiq import Broker

    from beatless.dramatiq._middleware import Beatless


def check_celery(name: str) -> Checked:
    """The schedule of the Celery app ``name`` names, as ``celery -A`` reads it:
    ``proj.module:app``, or ``proj.module`` with an ``app`` or ``celery`` attribute (or
    a ``proj.celery`` submodule). Tasks are imported as a worker imports them
    (``imports``, ``include``, autodiscovery), so unregistered tasks are warned about."""
    app = load_celery(name)
    from beatless.celery._schedule import check_app, unregistered_tasks

    found = check_app(app)
    if found.schedule is None:
        return found
    return Checked(found.schedule, warnings=tuple(unregistered_tasks(app, found.schedule)))


def load_celery(name: str) -> Any:
    """The Celery app ``name`` names, with its tasks imported (see :func:`check_celery`)."""
    try:
        from celery import Celery
        from celery.app.utils import find_app
    except ImportError as exc:
        raise ConfigError(
            f"--celery needs Celery: pip install 'beatless[celery]' ({exc})"
        ) from None
    try:
        app: Any = find_app(name)
    except Exception as exc:  # whatever the user's module raises, said in one line
        raise ConfigError(f"cannot load the Celery app {name!r}: {_describe(exc)}") from None
    if not isinstance(app, Celery):
        raise ConfigError(f"{name!r} is a {type(app).__name__}, not a Celery app")
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        raise ConfigError(
            f"Celery app {name!r}: cannot import its tasks: {_describe(exc)}"
        ) from None
    return app


def check_dramatiq(broker: str, modules: Sequence[str] = ()) -> Checked:
    """The schedule of the ``Beatless`` middleware of a Dramatiq broker, read as the
    ``dramatiq`` command reads its arguments: ``proj.module:broker`` names the broker,
    ``proj.module`` alone means the global broker once the module is imported; then
    ``modules`` are imported, so the actors they declare are in the schedule."""
    found_broker, middleware = load_dramatiq(broker, modules)
    return middleware.check(found_broker)


def load_dramatiq(broker: str, modules: Sequence[str] = ()) -> tuple[Broker, Beatless]:
    """The broker and its one ``Beatless`` middleware (see :func:`check_dramatiq`)."""
    try:
        from dramatiq import cli

        from beatless.dramatiq._middleware import find
    except ImportError as exc:
        raise ConfigError(
            f"--dramatiq needs Dramatiq: pip install 'beatless[dramatiq]' ({exc})"
        ) from None
    try:
        import_broker: Callable[[str], tuple[object, Broker]] = cli.import_broker
        _, found_broker = import_broker(broker)
        for module in modules:
            importlib.import_module(module)
    except Exception as exc:  # whatever the user's module raises, said in one line
        raise ConfigError(f"cannot load the Dramatiq broker: {_describe(exc)}") from None
    middleware = find(found_broker)
    if len(middleware) != 1:
        raise ConfigError(
            f"the broker of {broker!r} has {len(middleware)} Beatless middleware; "
            f"add exactly one: broker.add_middleware(Beatless(...))"
        )
    return found_broker, middleware[0]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
