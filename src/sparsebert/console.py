"""What the console shows: progress bars on a terminal only; piped into a log file, one plain line per log.

A progress bar redraws its line with carriage returns: on a terminal that is one line that updates, in a log file
hundreds of fragments on one line. Without a terminal the bars of datasets, transformers and the Trainer are off,
and the Trainer's log lines carry the step and the time left instead (``trainer.CompactPrinterCallback``)."""

from __future__ import annotations

import os


def interactive() -> bool:
    """Whether both stdout and stderr are terminals (the file descriptors: a redirection of either one into a file
    or a pipe makes the run a logged one). The bars draw on stderr, the Trainer's log lines go to stdout."""
    return os.isatty(1) and os.isatty(2)


def quiet_progress_bars() -> None:
    """Turn off the progress bars of datasets (``map``, loading), the hub and transformers when the run is not
    interactive; a no-op on a terminal."""
    if interactive():
        return
    import datasets
    import huggingface_hub.utils
    import transformers.utils.logging

    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def duration(seconds: float) -> str:
    """``H:MM:SS`` (``M:SS`` under an hour)."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
