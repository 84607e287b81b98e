"""The PostgreSQL store and its SQL.

The driver is imported when a store is made, not here.
"""

from beatless.stores.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
