"""The one exception type a user sees as a one-line message (run.py prints it and exits 2)."""


class SparseBertError(Exception):
    """Bad input or configuration: the message names the problem and how to fix it."""
