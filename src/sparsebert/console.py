"""What the console shows: progress bars on a terminal only; piped into a log file, one plain line per log.

A progress bar redraws its line with carriage returns: on a terminal that is one line that updates, in a log file
hundreds of fragments on one line. Without a terminal the bars of datasets, transformers and the Trainer are off,
and the Trainer's log lines carry the step and the time left instead (``trainer.CompactPrinterCallback``)."""

from __future__ import annotations

import logging
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


def configure_logging(level: int) -> None:
    """Log lines with time, level and logger at ``level`` (``run.py`` and each worker process of a job), without
    torchao's lines about kernels sparsebert never calls."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_torchao_import()


def quiet_torchao_import() -> None:
    """transformers imports torchao wherever it is installed (train.precision=fp8 needs it), and torchao's import
    warns about each optional kernel library it cannot load for this Python or GPU (mxfp8, CUTLASS sm90a; Triton on
    a CPU machine) and registers enums in a way torch calls deprecated: lines about kernels sparsebert never calls,
    in every run's log. Only those lines are dropped; anything else torchao or torch says still shows."""
    def not_an_optional_kernel(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Failed to load") or "register_constant() on Enum subclasses" in message
                    or "Detected no triton" in message)

    # a filter sees only its own logger's records, not its children's: each logger that says one of them
    for name in ("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
        logging.getLogger(name).addFilter(not_an_optional_kernel)
