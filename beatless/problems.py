"""Moved to :mod:`beatless.schedule.problems`; this path is kept until 0.3
and warns when imported."""

import sys

from beatless._moved import moved
from beatless.schedule.problems import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.schedule.problems")
