"""scripts/pretrain_study_table.py: the study's per-task GLUE processes (``glue_from=RUN~TASK``) come back as one
row per pretrained model, beside the MLM table of every pretraining run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sparsebert.results import Registry, RunRecord

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_study_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_study_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_glue_row_per_pretrained_model_and_every_mlm_run(tmp_path):
    registry = Registry.in_output_root(tmp_path)
    registry.record(RunRecord(run_dir=str(tmp_path / "dense"), experiment="dense", task="mlm", model="medium", seed=42,
                              status="done", metrics={"eval_loss": 3.0, "global_step": 8000, "masked_accuracy": 0.5,
                                                      "train_samples_per_second": 9000.0,
                                                      "recompiles_after_warmup": 0}))
    for task, metric, value in (("cola", "matthews_corr", 0.2), ("rte", "accuracy", 0.6)):
        for seed in (42, 43):
            name = f"glue_from=dense~{task}"
            registry.record(RunRecord(run_dir=str(tmp_path / name / str(seed)), experiment=name, task=f"glue:{task}",
                                      model=str(tmp_path / "dense"), seed=seed, status="done",
                                      metrics={metric: value + 0.01 * (seed - 42)}, group=name,
                                      pretrain_metrics={"eval_loss": 3.0, "perplexity": 20.1}))
    script = _script()
    reader = Registry.in_output_root(tmp_path, read_only=True)
    mlm = script.mlm_table(reader.runs(task_prefix="mlm"))
    assert "| `dense` | 8000 | 3.000 | 20.1 | 50.0 % | dense | 9000 | 0 |" in mlm
    glue = script.study_glue_records(reader)
    assert {r.label for r in glue} == {"glue_from=dense"} and len(glue) == 4
    table = script.glue_table(glue, agg="mean")
    assert sum(line.startswith("| glue_from=dense ") for line in table.splitlines()) == 1
