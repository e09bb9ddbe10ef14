"""SIGTERM while runs train: ``Terminated`` in the main thread, so the run records itself failed (plain Python:
``run.py`` installs it before its heavy imports, and so does each worker process of a job)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sparsebert.errors import Terminated


@contextmanager
def terminate_on_sigterm() -> Iterator[Callable[[], None]]:
    """While runs train (or a search waits on its trials), SIGTERM raises ``Terminated`` in this process's main
    thread, so the registry records the run as failed. SIGKILL cannot be caught: such a run stays "running".

    Yields ``raise_if_terminated``, which raises ``Terminated`` again once the handler has fired. The handler's own
    exception is lost where it lands in a ``__del__`` or a weakref callback (Python prints "Exception ignored in"
    and carries on), so the runs call it after every step (``StopWhenTerminated``) and between runs.

    The handler fires once: a scheduler or ``timeout`` signals the whole process group, and a second SIGTERM, or
    torch's SIGCHLD error for a DataLoader worker the same signal ended, must not cut the unwinding short. Forked
    children (DataLoader, featurize workers) inherit the handler; in them it restores the default and re-sends
    the signal, so they end as before instead of raising."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield lambda: None
        return
    owner = os.getpid()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGCHLD)}
    fired = False
    message = "terminated by SIGTERM"  # the one signal the handler is installed for

    def raise_terminated(signum: int, frame: object) -> None:
        nonlocal fired
        if os.getpid() != owner:  # a forked child: die of the signal, as without this handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        fired = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        raise Terminated(message)

    def raise_if_terminated() -> None:
        if fired:
            raise Terminated(message)

    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield raise_if_terminated
    finally:
        # SIGCHLD only if the handler replaced it: a DataLoader installs its own while runs train, for later runs
        restored = previous if fired else {signal.SIGTERM: previous[signal.SIGTERM]}
        for sig, handler in restored.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
