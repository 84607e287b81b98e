"""One node: the loop (``scheduler``) with its timeline, tally, build-ahead cache,
in-flight records and wake; its dispatchers, the preferred claimer, the board, runs and
stats; and the read-only views its readers see it through (``_view``).

Imports :mod:`beatless.fleet` and below.
"""
