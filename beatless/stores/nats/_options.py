"""The NATS store's options: its servers, its bucket's name, its durations and replicas,
and the URL's secrets (a password, or a token given as the user)."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlsplit

from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.urls import mask_url, secrets_of
from beatless.errors import ConfigError

_BUCKET = re.compile(r"[A-Za-z0-9_-]+")


def _bucket_name(bucket: str | None, namespace: str) -> str:
    if bucket is None:
        if not isinstance(namespace, str) or not _BUCKET.fullmatch(namespace):
            raise ConfigError(
                f"nats store: namespace {namespace!r} cannot name a bucket (letters, digits, "
                f"- and _ only); name one with ?bucket="
            )
        return f"beatless_{namespace}"
    if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket):
        raise ConfigError(f"nats store: bucket {bucket!r}: use letters, digits, - and _ only")
    return bucket


def _positive(value: DurationLike, what: str) -> timedelta:
    delta = as_timedelta(value, name=f"nats store: {what}")
    if delta <= timedelta(0):
        raise ConfigError(f"nats store: {what} must be positive, got {value!r}")
    return delta


def _replicas(value: int | str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= 5:
        raise ConfigError(f"nats store: replicas must be 1 to 5, got {value!r}")
    return count


def _split_servers(netloc: str) -> list[str]:
    """``user:pw@h1:4222,h2:4222`` as one URL per server, each with the credentials."""
    userinfo, _, hosts = netloc.rpartition("@")
    auth = f"{userinfo}@" if userinfo else ""
    return [f"nats://{auth}{host}" for host in hosts.split(",") if host]


def _mask(url: str) -> str:
    """``url`` with its password, or its token (a user with no password), masked."""
    masked = mask_url(url)
    parts = urlsplit(masked)
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at and ":" not in userinfo:
        masked = masked.replace(f"{userinfo}@", "***@", 1)
    return masked


def _secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    token = [parts.username] if parts.username and parts.password is None else []
    return secrets_of(url) + token
