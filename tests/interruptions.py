"""Training interrupted at a chosen point: by an exception, or by a real signal to this process (SIGKILL, SIGTERM).

``python tests/interruptions.py SIGNUM STEP WHEN SEED -- ARGV...`` runs ``run.py ARGV`` (cli.main)
with a :class:`SignalAt` among every run's callbacks: a run killed outright (SIGKILL) needs a process of its own.
"""

from __future__ import annotations

import os
import sys

from transformers import TrainerCallback


class Crash(Exception):
    """What :class:`CrashAt` raises."""


class Interruption(TrainerCallback):
    """Interrupts training at the end of optimizer step ``step`` (before that step's checkpoint is saved) or, with
    ``after_save``, right after the checkpoint of step ``step`` is saved (older ones rotated away).

    Args:
        step: the optimizer step.
        after_save: at the checkpoint of ``step`` rather than at the end of the step.
        seed: only in the run with this seed (the runs of a finetuning experiment share their callbacks).
    """

    def __init__(self, step: int, after_save: bool = False, seed: int | None = None) -> None:
        self.step, self.after_save, self.seed = step, after_save, seed

    def interrupt(self) -> None:
        raise NotImplementedError

    def _due(self, args, state, at_save: bool) -> bool:
        return (at_save == self.after_save and state.global_step == self.step
                and (self.seed is None or args.seed == self.seed))

    def on_step_end(self, args, state, control, **kwargs):
        if self._due(args, state, at_save=False):
            self.interrupt()

    def on_save(self, args, state, control, **kwargs):
        if self._due(args, state, at_save=True):
            self.interrupt()


class CrashAt(Interruption):
    """Raises :class:`Crash`: the run unwinds as on any error (its registry row becomes ``failed``)."""

    def interrupt(self) -> None:
        raise Crash(f"crashed at step {self.step}")


class SignalAt(Interruption):
    """Sends this process ``signum``: SIGKILL ends it on the spot; SIGTERM goes to run.py's handler."""

    def __init__(self, signum: int, step: int, after_save: bool = False, seed: int | None = None) -> None:
        super().__init__(step, after_save, seed)
        self.signum = signum

    def interrupt(self) -> None:
        os.kill(os.getpid(), self.signum)


def main_interrupted(argv: list[str], interruption: Interruption) -> int:
    """``cli.main(argv)`` with ``interruption`` among the callbacks of every run it starts; its exit code."""
    import sparsebert.runner as runner
    from sparsebert import cli

    run_experiment = runner.run_experiment

    def interrupted(cfg, opts, callbacks=None):
        return run_experiment(cfg, opts, callbacks=[*(callbacks or []), interruption])

    runner.run_experiment = interrupted
    try:
        return cli.main(argv)
    finally:
        runner.run_experiment = run_experiment


if __name__ == "__main__":
    signum, step, when, seed, separator, *cli_argv = sys.argv[1:]
    assert separator == "--" and when in ("step", "save"), sys.argv
    at = SignalAt(int(signum), int(step), after_save=when == "save", seed=None if seed == "-" else int(seed))
    sys.exit(main_interrupted(cli_argv, at))
