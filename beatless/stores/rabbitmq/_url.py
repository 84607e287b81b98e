"""The RabbitMQ store's URL and options: the store's own query parameters taken out of
the URL (the rest is pika's), the queue-name prefix, and the ``durable`` and
``channels`` values, each refused with a :class:`~beatless.errors.ConfigError` that
says what is allowed."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from beatless.errors import ConfigError

_MAX_PREFIX = 180
"""Queue names are at most 255 bytes: the prefix leaves room for the firing's part."""
_OPTIONS = {"durable", "timeout", "channels", "prefix"}


def split_url(url: str, where: str) -> tuple[dict[str, str], str]:
    """The store's own options from the URL's query, and the URL for pika without them."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("amqp", "amqps"):
        raise ConfigError(
            f"rabbitmq store: unknown URL scheme {parts.scheme!r} in {where}: use "
            f"amqp://user:password@host:5672/vhost or amqps://..."
        )
    if not parts.hostname:
        raise ConfigError(f"rabbitmq store: URL {where} names no host")
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in _OPTIONS}
    rest = urlencode([(k, v) for k, v in pairs if k not in _OPTIONS])
    return ours, urlunsplit(parts._replace(query=rest))


def prefix_of(prefix: str | None, namespace: str) -> str:
    value = prefix if prefix is not None else f"beatless.{namespace}."
    if not value or len(value.encode()) > _MAX_PREFIX or value.startswith("amq."):
        raise ConfigError(
            f"rabbitmq store: prefix {value!r} must be 1 to {_MAX_PREFIX} bytes and not start "
            f"with 'amq.' (queue names are at most 255 bytes)"
        )
    return value


def flag(value: bool | str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"rabbitmq store: durable must be true or false, got {value!r}")


def count(value: int | str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 256:
        raise ConfigError(f"rabbitmq store: channels must be 1 to 256, got {value!r}")
    return count
