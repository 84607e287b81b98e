"""Entries, schedules, firings and decisions, and the start-up check of a schedule.

Imports :mod:`beatless.core` and :mod:`beatless.stores` (a firing's claim request).
"""
