"""The console gets one compact line per log; per-tensor RigL values stay in the logs the trackers receive."""

from __future__ import annotations

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
