"""Moved to :mod:`beatless.ops.metrics`; this path is kept until 0.3 and warns when imported."""

import sys

from beatless._moved import moved
from beatless.ops.metrics import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.ops.metrics")
