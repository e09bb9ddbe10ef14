"""A finetuning run is in the results registry before its DONE marker exists, so a crash in between leaves a
run that --resume redoes (one row, updated), never a finished run that the results table misses."""

from __future__ import annotations

from pathlib import Path

import pytest

import sparsebert.jobs.finetune.common as common
from sparsebert.config import ExperimentRegistry
from sparsebert.results import RunRegistry
from sparsebert.runner import RunOptions, run_experiment

# one optimizer step (16 rows at tiny_glue's batch of 16): what is written when, not what is learned, is tested
ONE_RUN = ['finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=16",
           "finetune.max_eval_samples=16", "finetune.save_model=false"]

pytestmark = pytest.mark.slow


class Crash(Exception):
    pass


def test_crash_before_done_leaves_a_recorded_run_that_resume_finishes(data_dir, tmp_path, monkeypatch):
    cfg = ExperimentRegistry.builtin().build("tiny_glue", ONE_RUN)
    write = common.atomic_write_text

    def crash_on_done(path, text):
        if Path(path).name == "DONE":
            raise Crash
        write(path, text)

    monkeypatch.setattr(common, "atomic_write_text", crash_on_done)
    with pytest.raises(Crash):
        run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))
    run_dir = tmp_path / "tiny_glue" / "glue_rte" / "run0"
    assert not (run_dir / "DONE").exists()
    # recorded done before DONE, then failed by the crash: never a finished run without a row, nor a row that
    # claims a run DONE does not mark as finished
    (row,) = RunRegistry.in_output_root(tmp_path).runs(status=None)
    assert (row.run_dir, row.status, row.error) == (str(run_dir.resolve()), "failed", "Crash: (no message)")

    monkeypatch.setattr(common, "atomic_write_text", write)
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir, resume=True))
    assert (run_dir / "DONE").is_file()
    assert len(RunRegistry.in_output_root(tmp_path).runs()) == 1  # the row was updated, not duplicated


def test_only_the_main_process_writes_the_run_files(data_dir, tmp_path, monkeypatch):
    """Every rank computes the same gathered predictions; only the main process writes them (and the metrics,
    and DONE), after the model is saved. Simulated in one process: a rank that is not the main one."""
    from sparsebert.trainer.trainer import SparseBertTrainer

    cfg = ExperimentRegistry.builtin().build("tiny_glue", ONE_RUN)
    monkeypatch.setattr(SparseBertTrainer, "is_world_process_zero", lambda self: False)
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))
    run_dir = tmp_path / "tiny_glue" / "glue_rte" / "run0"
    assert run_dir.is_dir()
    written = {p.name for p in run_dir.iterdir()}
    assert not written & {"predictions_dev.tsv", "metrics.json", "DONE"}, written

    monkeypatch.undo()
    run_experiment(cfg, RunOptions(output_root=tmp_path / "main", data_dir=data_dir))
    main_dir = tmp_path / "main" / "tiny_glue" / "glue_rte" / "run0"
    assert {"predictions_dev.tsv", "metrics.json", "DONE"} <= {p.name for p in main_dir.iterdir()}
