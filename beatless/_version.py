"""The version of beatless, in a module of its own: the package's modules read it here,
never from the package root."""

__version__ = "0.1.0"
