"""``python -m beatless``: the same as the ``beatless`` command."""

from beatless.cli.command import main

raise SystemExit(main())
