"""The Redis store and the Redis Cluster store, and the Lua scripts both run.

The driver is imported when a store is made, not here.
"""

from beatless.stores.redis.store import RedisStore

__all__ = ["RedisStore"]
