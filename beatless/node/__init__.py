"""One node: the loop, its dispatchers, the preferred claimer, the board, runs and stats.

Imports :mod:`beatless.fleet` and below.
"""
