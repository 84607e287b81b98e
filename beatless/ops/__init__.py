"""What an operator reads: status, the status page and metrics.

Imports :mod:`beatless.node` and below.
"""
