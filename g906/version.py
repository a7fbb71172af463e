"""g906's version, on its own so that reading it imports nothing else of g906."""

__version__ = "0.1.0"
