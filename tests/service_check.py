"""Whether a real service a test needs is reachable: skip locally, fail in CI."""

from __future__ import annotations

import os
import socket

import pytest


def require_service(name: str, host: str, port: int, *, timeout: float = 1.0) -> None:
    """Skip the test unless ``host:port`` accepts a TCP connection.

    With ``BEATLESS_REQUIRE_SERVICES=1`` (as in CI) a missing service fails the test
    instead, so that a suite against real servers cannot pass by skipping them all.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        reason = f"{name} is not reachable at {host}:{port} ({exc})"
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


def require_binary(reason: str) -> None:
    """Skip the test because a server binary it starts a private instance of is missing
    (``reason`` says which); with ``BEATLESS_REQUIRE_SERVICES=1`` (as in CI) fail instead."""
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)
