"""The bottom layer: time, cron, gaps, triggers, durations, URLs, log text and driver imports.

Imports only the standard library and :mod:`beatless.errors`.
"""
