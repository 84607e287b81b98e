"""The NATS JetStream store: the store and its JetStream key-value session.

The driver is imported when a store is made, not here.
"""

from beatless.stores.nats.store import NATSStore

__all__ = ["NATSStore"]
