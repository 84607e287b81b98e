"""Moved to :mod:`beatless.core.triggers`; this path is kept until 0.3 and warns when imported."""

import sys

from beatless._moved import moved
from beatless.core.triggers import *  # noqa: F403

sys.modules[__name__] = moved(__name__, "beatless.core.triggers")
