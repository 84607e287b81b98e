"""Store URLs in messages: secrets never leave in a repr, a log line or an error."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit


def mask_url(url: str) -> str:
    """``url`` with its password, in the user part or the query, replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    pairs = parts.query.split("&") if parts.query else []
    query = "&".join(
        "password=***" if pair.split("=", 1)[0].lower() == "password" else pair for pair in pairs
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    masked = f"{parts.scheme}://{netloc}{parts.path}"
    masked += f"?{query}" if query else ""
    return masked + (f"#{parts.fragment}" if parts.fragment else "")


def secrets_of(url: str) -> list[str]:
    """The passwords a URL carries, to scrub them from messages that quote a driver."""
    parts = urlsplit(url)
    found = [parts.password] if parts.password else []
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
    return found
