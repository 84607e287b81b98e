"""Moved to :mod:`beatless.schedule.entry`; this path is kept until 0.3 and warns when imported."""

import sys

from beatless._moved import moved
from beatless.schedule.entry import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.schedule.entry")
