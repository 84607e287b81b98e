"""What the NATS store checks of its bucket, and tells of it.

A bucket that keeps claims for less than the store's ``ttl`` is lengthened, or refused;
one that discards old messages is refused; one that allows purges is warned of once
(see :mod:`beatless.stores.nats.store`). The checks log on the store's logger.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import describe, to_ms
from beatless.errors import StoreError
from beatless.stores.base import UNKNOWN, Fact, StoreFacts, Verdict
from beatless.stores.nats._jetstream import (
    Bucket,
    BucketInfo,
    BucketMissing,
    JetStreamError,
    bucket_config,
)
from beatless.stores.nats._judge import FORMAT_VERSION

logger = logging.getLogger("beatless.stores.nats.store")


class BucketChecks:
    """The bucket's settings, checked and told, for
    :class:`~beatless.stores.nats.store.NATSStore`."""

    bucket: str
    ttl: timedelta
    replicas: int
    _where: str
    _direct: bool
    _warned_purgeable: bool
    _call: Callable[..., Any]

    def _new_bucket(self) -> dict[str, object]:
        return bucket_config(
            self.bucket,
            description=f"beatless claims (format {FORMAT_VERSION}), epoch {secrets.token_hex(16)}",
            max_age_ms=to_ms(self.ttl),
            replicas=self.replicas,
        )

    async def _lengthen(self, kv: Bucket, info: BucketInfo) -> BucketInfo:
        """A bucket that keeps claims for less than this store's ``ttl`` (made with a
        shorter one): made to keep them for the ``ttl``. Lengthening is safe while other
        nodes run with the shorter ``ttl``: each needs at least its own."""
        was = describe(timedelta(milliseconds=info.max_age_ms))
        try:
            longer = await kv.keep_for(to_ms(self.ttl))
        except (JetStreamError, BucketMissing, TimeoutError) as exc:  # refused, or denied
            logger.warning(
                "nats store %s: bucket %s keeps claims for %s; lengthening it to the ttl %s "
                "failed (%s)",
                shown(self._where, quoted=False),
                shown(self.bucket),
                was,
                describe(self.ttl),
                exc,
            )
            return info
        logger.warning(
            "nats store %s: bucket %s kept claims for %s, less than the ttl %s: it keeps "
            "them for %s from now on",
            shown(self._where, quoted=False),
            shown(self.bucket),
            was,
            describe(self.ttl),
            describe(self.ttl),
        )
        return longer

    def lengthen_memory(self, needed: timedelta) -> str:
        """Open the store with a ``ttl`` over ``needed``, in whole minutes."""
        minutes = to_ms(needed) // 60_000 + 1
        return (
            f"open the store with ?ttl={minutes}m (or &ttl={minutes}m after other options; "
            f"the bucket is lengthened to it at start)"
        )

    def _check(self, info: BucketInfo) -> None:
        """Refuse a bucket that would forget claims sooner than this store says it keeps them."""
        where, name, need = self._where, self.bucket, to_ms(self.ttl)
        if 0 < info.max_age_ms < need:
            raise StoreError(
                f"nats store {where}: bucket {name!r} keeps claims for "
                f"{describe(timedelta(milliseconds=info.max_age_ms))}, less than the ttl "
                f"{describe(self.ttl)} this store promises, and it could not be lengthened; "
                f"give the NATS user the right to update the stream (STREAM.UPDATE), "
                f"lengthen its max age with `nats stream edit KV_{name} --max-age "
                f"{describe(self.ttl)}`, or open the store with ?ttl= no longer than the "
                f"bucket's max age"
            )
        if info.drops_old:
            raise StoreError(
                f"nats store {where}: bucket {name!r} has a message count or size limit that "
                f"discards old messages, so claims could be forgotten early; remove the limit"
            )
        self._direct = info.direct and info.replicas == 1
        if info.purgeable and not self._warned_purgeable:
            self._warned_purgeable = True
            logger.warning(
                "nats store %s: bucket %s allows purges or roll-ups (it was not created by "
                "beatless): a purge would empty it unnoticed, and a firing could be sent twice",
                shown(where, quoted=False, limit=ERROR_LIMIT),
                shown(name),
            )

    def facts(self) -> StoreFacts:
        """The bucket's storage (``file`` or ``memory``), its replicas and its size limit
        (``STREAM.INFO``)."""
        store = f"nats store {self._where}"
        try:
            info = self._call("read its settings", lambda kv: kv.info(), notes=True)
        except StoreError:
            why = "could not be read"
            unread = (Fact(n, UNKNOWN, Verdict.WARN, why) for n in ("storage", "replicas"))
            return StoreFacts(store, tuple(unread))
        facts = [Fact("storage", info.storage)]
        if info.storage != "file":
            why = "a restart of the server forgets every claim; use a bucket with file storage"
            facts[0] = Fact("storage", info.storage, Verdict.WARN, why)
        facts.append(Fact("replicas", str(info.replicas)))
        usage = None
        if info.max_bytes > 0:
            share = info.bytes / info.max_bytes
            usage = f"{info.bytes} bytes of max_bytes {info.max_bytes} ({share:.0%})"
        return StoreFacts(store, tuple(facts), usage=usage)
