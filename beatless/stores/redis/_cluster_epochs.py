"""The Redis Cluster store's epochs, one per bucket, and their horizons (see "Epoch per
bucket" and "Re-seeding, on one digest" in :mod:`beatless.stores.redis.cluster`)."""

from __future__ import annotations

import logging

from beatless.core._logtext import shown
from beatless.errors import StoreError
from beatless.stores._epoch import (
    EVICTED,
    FAILOVER,
    describe_change,
    describe_failover,
    has_changed,
    horizon_ms,
    new_token,
)
from beatless.stores.base import Epoch
from beatless.stores.redis._buckets import BUCKETS, EPOCHS_LUA, Call, digest
from beatless.stores.redis._cluster_client import ClusterClient
from beatless.stores.redis._wire import as_text, epoch_cause, parse_epoch

logger = logging.getLogger("beatless.stores.redis.cluster")

Changed = tuple[str, Epoch, Epoch, bool]
"""A bucket whose epoch changed: the bucket, the epoch seen before, the new one, and
whether a failover to a replica began it."""


class BucketEpochs(ClusterClient):
    """The epoch of each bucket as this store object last saw it, their digest
    (:attr:`epoch`), and each bucket's forgetting horizon."""

    epoch: Epoch | None
    _epochs: dict[str, Epoch]
    _horizons: dict[str, int]

    def _read_epochs(self) -> None:
        """At a store object's first call: read every bucket's epoch, writing the absent.
        A bucket whose epoch an eviction began is left unseen: its claims then judge it as
        a caller that saw no epoch before (``claim.lua``, "Eviction")."""
        if self._epochs:
            return
        epochs = {
            bucket: epoch for bucket, epoch, cause in self._epoch_records() if cause != EVICTED
        }
        if not self._epochs and epochs:
            self._epochs = epochs
            self.epoch = digest(epochs)

    def recheck_epoch(self) -> None:
        """Read every bucket's epoch again (one pipeline), adopting each change with its
        horizon as a claim in that bucket would: a node that learned of a change from
        another node's note, or whose claim met one, then names every change so far."""
        with self._errors("read the epochs"):
            if not self._epochs:
                self._read_epochs()
                return
            changed: list[Changed] = []
            self._adopt_all(changed)
        if changed:
            self._warn_changed(changed)

    def _adopt_all(self, changed: list[Changed]) -> None:
        """Read every bucket's epoch and adopt each (``changed`` gets those that changed)."""
        for bucket, epoch, cause in self._epoch_records():
            self._adopt_epoch(bucket, epoch, cause == FAILOVER, changed)
        self.epoch = digest(self._epochs)

    def _epoch_records(self, cause: str | None = None) -> list[tuple[str, Epoch, str]]:
        """Every bucket's epoch, and what began it, in one pipeline
        (``epochs.lua``, one call per slot), the absent written; with ``cause``, every one
        begun again with it."""
        from redis.crc import key_slot

        by_slot: dict[int, list[str]] = {}
        for bucket in BUCKETS:
            by_slot.setdefault(key_slot(self._key(bucket, "epoch").encode()), []).append(bucket)
        token = new_token()
        calls: list[Call] = [
            ([self._key(b, "epoch") for b in buckets], [token, *([cause] if cause else [])])
            for buckets in by_slot.values()
        ]
        replies = self._run(EPOCHS_LUA, calls)
        epochs = []
        for buckets, records in zip(by_slot.values(), replies, strict=True):
            for bucket, record in zip(buckets, map(as_text, records), strict=True):
                epoch = parse_epoch(record)
                if epoch is None:
                    raise StoreError(
                        f"redis cluster store {self._where}: unreadable epoch record at "
                        f"{self._key(bucket, 'epoch')!r}: {record[:80]!r}"
                    )
                epochs.append((bucket, epoch, epoch_cause(record)))
        return epochs

    @property
    def forgot_before_ms(self) -> int | None:
        """The latest horizon of any bucket (each bucket keeps its own)."""
        return max(self._horizons.values(), default=None)

    def settle(self, epoch: Epoch) -> bool:
        """Drop every bucket's horizon, if ``epoch`` is still this object's digest of them."""
        if self.epoch is None or self.epoch.token != epoch.token:
            return False
        self._horizons.clear()
        return True

    def _adopt(self, bucket: str, record: str, changed: list[Changed]) -> None:
        """Adopt the epoch a bucket's claim saw (see :meth:`_adopt_epoch`)."""
        epoch = parse_epoch(record)
        if epoch is not None:
            self._adopt_epoch(bucket, epoch, epoch_cause(record) == FAILOVER, changed)

    def _adopt_epoch(
        self, bucket: str, epoch: Epoch, failover: bool, changed: list[Changed]
    ) -> None:
        """Adopt a bucket's epoch, keeping the bucket's forgetting horizon; ``changed``
        gets the bucket if its epoch changed (and whether a failover did it)."""
        seen = self._epochs.get(bucket)
        self._epochs[bucket] = epoch
        horizon = horizon_ms(seen, epoch, self._horizons.get(bucket))
        if horizon is not None:
            self._horizons[bucket] = horizon
        if seen is not None and has_changed(seen, epoch):
            changed.append((bucket, seen, epoch, failover))

    def _warn_changed(self, changed: list[Changed]) -> None:
        """One WARNING per claim (or re-read) that found buckets with a new epoch, naming
        their masters and whether a failover to a replica began it."""
        self.epoch = digest(self._epochs)
        masters = sorted({self._master_of(bucket) for bucket, *_ in changed})
        _, seen, current, failover = changed[0]
        logger.warning(
            "redis cluster store %s: %d bucket(s) on master %s: %s",
            shown(self._where, quoted=False),
            len(changed),
            ", ".join(masters),
            describe_failover(seen, current, waits=False)
            if failover
            else describe_change(seen, current),
        )
