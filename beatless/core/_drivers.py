"""The optional drivers, each imported where it is first needed, with one line naming the
extra that installs it.

Every store and integration imports its driver through :func:`driver` (or asks
:func:`missing` without importing it), so that ``import beatless`` pulls in no driver,
and a missing one is one :class:`~beatless.errors.ConfigError` naming the extra — at
``beatless check`` time and when a node starts — never a ``ModuleNotFoundError`` from
deep inside a store.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from beatless.errors import ConfigError

EXTRAS = {
    "redis": ("redis", "redis"),
    "pika": ("pika", "rabbitmq"),
    "psycopg": ("psycopg", "postgres"),
    "nats": ("nats-py", "nats"),
    "prometheus_client": ("prometheus-client", "metrics"),
    "redbeat": ("celery-redbeat", "redbeat"),
    "ephem": ("ephem", "solar"),
}
"""Per driver module: the package that provides it, and the beatless extra that installs
it (``pyproject.toml``)."""


def install_hint(module: str) -> str:
    """``pip install 'beatless[extra]'`` for the driver ``module`` (its top-level name)."""
    return f"pip install 'beatless[{EXTRAS[_top(module)][1]}]'"


def message(module: str, needed_by: str) -> str:
    """The one line that says ``needed_by`` lacks the driver ``module``, and what to run."""
    package, extra = EXTRAS[_top(module)]
    return (
        f"{needed_by} needs the {package} package, which beatless's {extra} extra installs: "
        f"{install_hint(module)} (from a clone: pip install '.[{extra}]')"
    )


def missing(module: str, needed_by: str) -> str | None:
    """:func:`message` when the driver ``module`` is not installed, else ``None``. Imports
    nothing: what ``beatless check`` asks, so that a missing driver is a problem before a
    node starts."""
    if importlib.util.find_spec(_top(module)) is None:
        return message(module, needed_by)
    return None


def driver(module: str, needed_by: str) -> ModuleType:
    """The top-level driver package of ``module`` (a dotted name imports that submodule
    too, e.g. ``"psycopg.sql"``); a :class:`~beatless.errors.ConfigError` naming the extra
    when it is not installed. An import error from inside an installed driver (a missing
    C library, a broken install) is said with the same line and its own text."""
    top = _top(module)
    try:
        found = importlib.import_module(top)
        importlib.import_module(module)
    except ImportError as exc:
        said = message(module, needed_by)
        if exc.name not in (top, module):
            said += f"; importing it failed: {type(exc).__name__}: {exc}"
        raise ConfigError(said) from None
    return found


def _top(module: str) -> str:
    return module.split(".", 1)[0]
