"""The old module paths kept for one release: each is the moved module itself."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType


def moved(old: str, new: str) -> ModuleType:
    """The module ``new``, after a :class:`DeprecationWarning` that ``old`` moved there."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes in beatless 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    return importlib.import_module(new)
