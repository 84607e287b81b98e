"""Where the Celery integration tests find their services (database 13, own prefixes)."""

from __future__ import annotations

REDIS_HOST, REDIS_PORT, REDIS_DB = "127.0.0.1", 6379, 13
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
