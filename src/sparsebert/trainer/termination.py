"""Stopping a run whose SIGTERM was swallowed (see ``sparsebert.sigterm.terminate_on_sigterm``)."""

from __future__ import annotations

from collections.abc import Callable

from transformers import TrainerCallback


class StopWhenTerminated(TrainerCallback):
    """Calls ``raise_if_terminated`` after every optimizer step and evaluation.

    The SIGTERM handler raises ``Terminated`` wherever the main thread is; inside a ``__del__`` or a weakref callback
    Python prints that exception and carries on, and the run would train on until SIGKILL left its registry row
    ``running``. ``raise_if_terminated`` raises it again from here, where it unwinds the run.

    Args:
        raise_if_terminated: raises ``Terminated`` once SIGTERM has arrived; otherwise returns.
    """

    def __init__(self, raise_if_terminated: Callable[[], None]) -> None:
        self.raise_if_terminated = raise_if_terminated

    def on_step_end(self, args, state, control, **kwargs):
        self.raise_if_terminated()

    def on_evaluate(self, args, state, control, **kwargs):
        self.raise_if_terminated()
