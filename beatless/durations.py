"""Moved to :mod:`beatless.core.durations`; this path is kept until 0.3 and warns when imported."""

import sys

from beatless._moved import moved
from beatless.core.durations import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.core.durations")
