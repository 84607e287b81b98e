"""The notes a fleet keeps in its claim store: their formats, schemas and limits,
the controls (pause, resume, run now) and the audit.

Imports :mod:`beatless.schedule` and below.
"""
