"""Moved to :mod:`beatless.ops.status`; this path is kept until 0.3 and warns when imported."""

import sys

from beatless._moved import moved
from beatless.ops.status import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.ops.status")
