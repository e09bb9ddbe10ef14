"""The exceptions a user sees as a one-line message: bad input (run.py exits 2) and a terminated run (143)."""


class SparseBertError(Exception):
    """Bad input or configuration: the message names the problem and how to fix it."""


class Terminated(BaseException):
    """SIGTERM (a scheduler's, ``timeout``'s) raised in the main thread, so a run unwinds through its ``except``
    and ``finally`` blocks: its registry row becomes ``failed`` with this as its error instead of staying
    ``running`` forever. A BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""
