"""``run.py NAME --profile``: a torch.profiler trace of a few training steps after warm-up, in the run dir."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import TrainerCallback

from sparsebert.io import atomic_write_text

log = logging.getLogger(__name__)


class ProfilerCallback(TrainerCallback):
    """Profiles optimizer steps warmup+1 .. warmup+steps and writes ``trace.json`` (Chrome / Perfetto) and
    ``top_ops.txt`` (the most expensive operators) into ``out_dir`` (default: ``profile/`` in the run directory)."""

    def __init__(self, warmup: int = 5, steps: int = 3, out_dir: Path | None = None):
        self.warmup, self.steps, self.out_dir = warmup, steps, out_dir
        self.profiler: torch.profiler.profile | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup and self.profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self.profiler.__enter__()
        elif self.profiler is not None and state.global_step == self.warmup + self.steps:
            self._finish(Path(args.output_dir))

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:  # training ended inside the window
            self._finish(Path(args.output_dir))

    def _finish(self, run_dir: Path) -> None:
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        out = self.out_dir or run_dir / "profile"
        out.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(out / "trace.json"))
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        atomic_write_text(out / "top_ops.txt", profiler.key_averages().table(sort_by=sort, row_limit=30) + "\n")
        log.info("profile of %d steps written to %s", self.steps, out)
        self.warmup = -1  # once per run
