"""``python -m beatless``: the same as the ``beatless`` command."""

from beatless.cli import main

raise SystemExit(main())
