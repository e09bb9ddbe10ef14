"""The steps, time and loss behind a model survive a resume in the checkpoint's trainer_state.json, and a resume
from the final checkpoint trains no step past max_steps (the Trainer alone trains one and saves it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import Regression
from transformers import TrainingArguments

from sparsebert.trainer.totals import Totals, TrainingTotals
from sparsebert.trainer.trainer import SparseBertTrainer

STEPS = 6


def _train(out: Path, resume_from: Path | None = None) -> tuple[SparseBertTrainer, Totals]:
    torch.manual_seed(0)
    rows = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(64)]  # 16 steps an epoch
    args = TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, report_to=[],
                             save_strategy="steps", save_steps=2, logging_steps=4, use_cpu=True, disable_tqdm=True,
                             seed=0)
    trainer = SparseBertTrainer(model=Regression(), args=args, train_dataset=rows)
    totals = TrainingTotals(trainer)
    trainer.add_callback(totals)
    result = trainer.train(resume_from_checkpoint=None if resume_from is None else str(resume_from))
    return trainer, totals.at_end(result)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, Totals]:
    out = tmp_path_factory.mktemp("uninterrupted")
    return out, _train(out)[1]


def _saved_totals(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["TrainingTotals"]


def test_every_checkpoint_keeps_the_totals_so_far(uninterrupted):
    out, totals = uninterrupted
    saved = [_saved_totals(out / f"checkpoint-{step}")["attributes"] for step in (2, 4, 6)]
    assert [s["steps"] for s in saved] == [2, 4, 6]
    assert saved[0]["seconds"] < saved[1]["seconds"] < saved[2]["seconds"] <= totals.seconds
    assert saved[2]["loss_sum"] == pytest.approx(totals.loss_sum, rel=1e-6)
    assert totals.steps == STEPS and totals.train_loss == pytest.approx(totals.loss_sum / STEPS)


def test_a_resume_carries_the_totals_of_its_checkpoint(uninterrupted, tmp_path):
    out, expected = uninterrupted
    trainer, totals = _train(tmp_path, resume_from=out / "checkpoint-2")
    carried = _saved_totals(out / "checkpoint-2")["attributes"]
    assert trainer.state.global_step == STEPS and totals.steps == STEPS
    assert totals.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)  # the same steps' losses
    assert totals.seconds > carried["seconds"]


def test_a_resume_from_the_final_checkpoint_trains_no_step(uninterrupted, tmp_path):
    out, expected = uninterrupted
    trainer, totals = _train(tmp_path, resume_from=out / f"checkpoint-{STEPS}")
    assert trainer.state.global_step == STEPS  # the Trainer alone trains step 7 and saves checkpoint-7
    assert list(tmp_path.glob("checkpoint-*")) == []
    saved = Totals(**_saved_totals(out / f"checkpoint-{STEPS}")["attributes"])
    assert (totals.steps, totals.loss_sum) == (saved.steps, saved.loss_sum) and totals.seconds >= saved.seconds
    assert totals.train_loss == pytest.approx(expected.train_loss, rel=1e-6)


def test_a_checkpoint_from_before_the_totals_resumes_counting_its_own_steps(uninterrupted, tmp_path):
    """A checkpoint written before this callback existed: its steps are not counted (nothing says how long they
    took), the resumed steps are, and the next checkpoint saves (the Trainer looks the callback's entry up)."""
    out, _ = uninterrupted
    old = tmp_path / "old" / "checkpoint-2"
    old.parent.mkdir()
    shutil.copytree(out / "checkpoint-2", old)
    state = json.loads((old / "trainer_state.json").read_text())
    del state["stateful_callbacks"]["TrainingTotals"]
    (old / "trainer_state.json").write_text(json.dumps(state))
    trainer, totals = _train(tmp_path / "new", resume_from=old)
    assert trainer.state.global_step == STEPS and totals.steps == STEPS - 2
    assert _saved_totals(tmp_path / "new" / f"checkpoint-{STEPS}")["attributes"]["steps"] == STEPS - 2


def test_no_step_no_figures() -> None:
    assert Totals().train_loss is None and Totals().samples_per_second(8) is None
    assert Totals(3, 2.0, 6.0).samples_per_second(8) == 12.0 and Totals(3, 2.0, 6.0).train_loss == 2.0
