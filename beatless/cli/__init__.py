"""The ``beatless`` command, the demo, the TOML schedule loader and ``celery beatless``.

The top layer: it may import every other. :func:`main` is the ``beatless`` command.
"""

from beatless.cli.command import main

__all__ = ["main"]
