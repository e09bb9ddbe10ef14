"""The console gets one compact line per log; per-tensor RigL values stay in the logs the trackers receive."""

from __future__ import annotations

import pytest
from transformers import PrinterCallback, ProgressCallback, TrainerControl, TrainerState, TrainingArguments

from sparsebert.trainer.trainer import CompactPrinterCallback, console_logs

LOGS = {"loss": 2.5, "rigl/drop_fraction": 0.3, "rigl/moved_total": 1200.0,
        "rigl/moved/bert.encoder.layer.0.attention.self.query.weight": 100.0}


def test_console_lines_leave_out_per_tensor_values_and_keep_the_totals(capsys, tmp_path):
    logs = dict(LOGS)
    state = TrainerState()
    CompactPrinterCallback().on_log(TrainingArguments(output_dir=str(tmp_path)), state, TrainerControl(), logs=logs)
    line = capsys.readouterr().out
    assert "rigl/moved_total" in line and "rigl/drop_fraction" in line and "'loss'" in line
    assert "rigl/moved/" not in line
    assert logs == LOGS  # what the trackers get is untouched
    assert console_logs(LOGS).keys() == LOGS.keys() - {"rigl/moved/bert.encoder.layer.0.attention.self.query.weight"}


def test_the_trainer_prints_through_the_compact_callbacks(tmp_path):
    from torch import nn

    from sparsebert.trainer.trainer import SparseBertTrainer

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)

        def forward(self, x=None, labels=None):
            return {"loss": self.linear(x).sum()}

    for disable_tqdm in (False, True):
        args = TrainingArguments(output_dir=str(tmp_path), disable_tqdm=disable_tqdm, report_to=[])
        callbacks = [type(c) for c in SparseBertTrainer(model=Tiny(), args=args).callback_handler.callbacks]
        assert ProgressCallback not in callbacks and PrinterCallback not in callbacks
        assert any(issubclass(c, (ProgressCallback, PrinterCallback)) for c in callbacks)


def test_a_logged_run_prints_the_step_and_the_time_left(capsys, tmp_path, monkeypatch):
    """Without progress bars (stdout or stderr not a terminal) each log line says where the run is."""
    import sparsebert.trainer.trainer as trainer_module

    clock = iter([100.0, 110.0])  # training begins at 100 s; the log at step 5 of 20 comes 10 s later
    monkeypatch.setattr(trainer_module.time, "monotonic", lambda: next(clock))
    args, state, printer = TrainingArguments(output_dir=str(tmp_path)), TrainerState(), CompactPrinterCallback()
    state.max_steps = 20
    printer.on_train_begin(args, state, TrainerControl())
    state.global_step = 5
    printer.on_log(args, state, TrainerControl(), logs={"loss": 2.5, "total_flos": 1e12})
    line = capsys.readouterr().out
    assert line == "step 5/20 (25%), 0:10 elapsed, 0:30 left: {'loss': '2.5'}\n"


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_bars_only_on_a_terminal(monkeypatch, tmp_path, terminal):
    """A log file must not fill with carriage-return redraws: the Trainer's and datasets' bars are off unless both
    stdout and stderr are terminals."""
    import datasets

    import sparsebert.console
    from sparsebert.config.sections import TrainConfig
    from sparsebert.trainer.arguments import training_arguments

    monkeypatch.setattr(sparsebert.console.os, "isatty", lambda fd: terminal or fd == 2)  # stdout piped if not
    args = training_arguments(TrainConfig(report_to=[]), tmp_path, seed=0, run_name="r")
    assert args.disable_tqdm is not terminal
    import huggingface_hub.utils as hub
    import transformers.utils.logging as transformers_logging

    # (is the bar on?, turn it on, turn it off) of each library; restored after the test
    switches = [(datasets.is_progress_bar_enabled, datasets.enable_progress_bars, datasets.disable_progress_bars),
                (lambda: not hub.are_progress_bars_disabled(), hub.enable_progress_bars, hub.disable_progress_bars),
                (transformers_logging.is_progress_bar_enabled, transformers_logging.enable_progress_bar,
                 transformers_logging.disable_progress_bar)]
    before = [is_on() for is_on, _, _ in switches]
    try:
        for _, on, _ in switches:
            on()
        sparsebert.console.quiet_progress_bars()
        assert [is_on() for is_on, _, _ in switches] == [terminal] * 3
    finally:
        for (_, on, off), was_on in zip(switches, before):
            (on if was_on else off)()
