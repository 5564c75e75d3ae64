"""The installed labfbo's version (a module of its own, so any part can read it without importing the package's API)."""

__version__ = "0.1.0"
