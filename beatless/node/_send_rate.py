"""The measured send rate of the two-phase path, and the sub-batch size it allows: a
sub-batch is claimed so that its sends take at most a third of the lease
(:class:`~beatless.node.dispatch.TwoPhase`)."""

from __future__ import annotations

import math

SUB_BATCH_SHARE = 1 / 3
"""A sub-batch is sized so that its sends take at most this share of the lease."""

MAX_SUB_BATCH = 1_000
FIRST_SUB_BATCH = 100
"""Until the send rate is measured, sub-batches hold at most this many firings."""


class SendRate:
    """The measured time of one send, and the sub-batch size it allows."""

    def __init__(self) -> None:
        self.mean_s: float | None = None
        self.samples = 0

    def observe(self, seconds: float) -> None:
        self.samples += 1
        if self.mean_s is None:
            self.mean_s = seconds
        else:  # a moving mean that follows a broker getting slower within a few sends
            self.mean_s += (seconds - self.mean_s) * 0.2

    def expected_ms(self) -> int:
        """How long the next send is expected to take."""
        return 0 if self.mean_s is None else math.ceil(self.mean_s * 1_000)

    def sub_batch(self, lease_ms: int) -> int:
        """How many firings to claim at once so that their sends take a third of the lease."""
        measured = self.mean_s is not None and self.samples >= 10
        cap = MAX_SUB_BATCH if measured else FIRST_SUB_BATCH
        if not self.mean_s:
            return cap
        fits = math.floor(lease_ms * SUB_BATCH_SHARE / 1_000 / self.mean_s)
        return max(1, min(cap, fits))
