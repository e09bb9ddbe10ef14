"""A SIGTERM whose handler runs inside a finalizer, where Python prints the handler's exception and carries on."""

from __future__ import annotations

import os
import signal
import sys


class _SendsSigtermWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecode boundaries: the Python-level handler runs here, inside __del__
            pass


def sigterm_inside_a_finalizer() -> list[BaseException]:
    """Send this process SIGTERM from a ``__del__`` and return the exceptions Python swallowed there.

    Returns:
        the exceptions passed to ``sys.unraisablehook`` meanwhile (the handler's).
    """
    # without a handler (outside terminate_on_sigterm, or off the main thread) SIGTERM would end the test process
    assert callable(signal.getsignal(signal.SIGTERM)), "call this inside terminate_on_sigterm"
    swallowed: list[BaseException] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: swallowed.append(unraisable.exc_value)
    try:
        _SendsSigtermWhenCollected()  # collected at once: no reference is kept
    finally:
        sys.unraisablehook = hook
    return swallowed
