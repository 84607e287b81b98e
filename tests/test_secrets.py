"""A store password never leaves in a masked URL or an error, whatever it holds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beatless.cli.command import main
from beatless.core.urls import mask_url, scrub, secrets_of
from beatless.errors import BeatlessError
from beatless.stores import open_store

SCHEMES = ["redis", "rediss", "redis+cluster", "postgresql", "nats", "amqp", "unix"]
OPENED = [*SCHEMES, "redis+sentinel"]
"""Schemes whose URLs are masked and opened (a sentinel store connects at its first call,
so the commands, which probe, are tried with the others only)."""
HOST = {
    "unix": "/run/redis.sock?db=1",
    "redis+cluster": "localhost:7000",
    "redis+sentinel": "localhost:26379,[::1]:26380/mymaster/0",
}
"""What follows the user part in a URL of each scheme (``localhost:6379/0`` otherwise)."""

passwords = st.text(
    alphabet=st.sampled_from("abcXYZ019/#?@:%&=[]+ ;\\'\"\n"), min_size=4, max_size=24
)


def _url(scheme: str, password: str) -> str:
    return f"{scheme}://user:{password}@{HOST.get(scheme, 'localhost:6379/0')}"


@given(password=passwords, scheme=st.sampled_from(OPENED))
def test_mask_url_shows_no_character_of_any_password(password: str, scheme: str) -> None:
    masked = mask_url(_url(scheme, password))
    assert masked == f"{scheme}://user:***@{HOST.get(scheme, 'localhost:6379/0')}"


@given(password=passwords.filter(lambda p: "&" not in p))
def test_a_password_in_the_query_is_masked_to_the_next_option(password: str) -> None:
    masked = mask_url(f"redis://localhost:6379/0?password={password}&db=2")
    assert password not in masked
    if "@" not in password:  # an @ makes the user part reach into the query: more is masked
        assert masked == "redis://localhost:6379/0?password=***&db=2"
    assert password not in mask_url(f"redis://localhost/0?db=1&password={password}")
    sentinel = f"redis+sentinel://h1,h2/svc/0?sentinel_password={password}&db=2"
    assert password not in mask_url(sentinel)
    if "@" not in password:
        assert mask_url(sentinel) == "redis+sentinel://h1,h2/svc/0?sentinel_password=***&db=2"


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(password=passwords, scheme=st.sampled_from(OPENED))
def test_open_store_errors_never_quote_a_password(password: str, scheme: str) -> None:
    shown = ""
    try:
        store = open_store(_url(scheme, password), namespace="secrets")
    except BeatlessError as exc:
        shown = f"{exc} {exc!r}"
    else:
        shown = repr(store)
        store.close()
    assert password not in shown


def test_a_drivers_message_loses_every_piece_of_the_password() -> None:
    url = "redis://user:sec/ret#pa?ss@localhost:6379/0"
    text = "Port could not be cast to integer value as 'sec'; option pa?ss; the password"
    assert scrub(text, url) == (
        "Port could not be cast to integer value as '***'; option ***?***; the password"
    )
    assert "sec/ret#pa?ss" in secrets_of(url)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("command", [["status"], ["pause", "tick"], ["run-now", "tick"]])
@pytest.mark.parametrize("password", ["pa/ss#w?rd", "abc/defg", "s3cr[et@x", "se#cret:1"])
def test_no_command_prints_a_password_that_breaks_the_url(
    scheme: str, command: list[str], password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _url(scheme, password)
    code = main([*command, "--store", url, "--namespace", "secrets"])
    out, err = capsys.readouterr()
    assert code != 0
    assert "user:***@" in err, err
    for piece in {password, *password.replace("#", "/").replace("?", "/").split("/")}:
        if len(piece) >= 3:
            assert piece not in out + err, (piece, err)


def test_an_at_sign_past_the_host_is_refused_with_how_to_encode_it() -> None:
    with pytest.raises(BeatlessError) as caught:
        open_store("redis://user:1234/secret@localhost:6379/0", namespace="secrets")
    text = str(caught.value)
    assert "secret" not in text
    assert "redis://user:***@localhost:6379/0" in text
    assert "%2F" in text
    with open_store(
        "redis://user:s%2Fcret@localhost:6379/0?client_name=a%40b", namespace="secrets"
    ) as store:
        assert "s%2Fcret" not in repr(store)
