"""Moved to :mod:`beatless.stores.redis.cluster`; this path is kept until 0.3
and warns when imported."""

import sys

from beatless._moved import moved
from beatless.stores.redis.cluster import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.stores.redis.cluster")
