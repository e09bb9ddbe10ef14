"""scripts/pretrain_study_table.py: the study's per-task GLUE processes (``glue_from=RUN~TASK``) come back as one
row per pretrained model, beside the MLM table of every pretraining run; the learning-rate grid
(``glue_from=RUN~TASK~lrLR``) as one row per model and rate, and one with each task's best rate."""

from __future__ import annotations

import json
from pathlib import Path

from module_loading import load_module

from sparsebert.results import RunRecord, RunRegistry

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_study_table.py"


def _script():
    return load_module(SCRIPT)


def test_one_glue_row_per_pretrained_model_and_every_mlm_run(tmp_path):
    registry = RunRegistry.in_output_root(tmp_path)
    registry.record(RunRecord(run_dir="/elsewhere/out/dense", experiment="dense", task="mlm", model="medium", seed=42,
                              status="done", metrics={"eval_loss": 3.0, "global_step": 8000, "masked_accuracy": 0.5,
                                                      "train_samples_per_second": 9000.0,
                                                      "recompiles_after_warmup": 0}))
    for task, metric, value in (("cola", "matthews_corr", 0.2), ("rte", "accuracy", 0.6)):
        for seed in (42, 43):
            name = f"glue_from=dense~{task}"
            registry.record(RunRecord(run_dir=str(tmp_path / name / str(seed)), experiment=name, task=f"glue:{task}",
                                      model=str(tmp_path / "dense"), seed=seed, status="done",
                                      metrics={metric: value + 0.01 * (seed - 42), "score": value + 0.01 * (seed - 42)},
                                      group=name,
                                      pretrain_metrics={"eval_loss": 3.0, "perplexity": 20.1}))
    for task, lr, value in (("rte", "1e-4", 0.7), ("rte", "2e-4", 0.5), ("cola", "2e-4", 0.1)):
        name = f"glue_from=dense~{task}~lr{lr}"
        registry.record(RunRecord(run_dir=str(tmp_path / name), experiment=name, task=f"glue:{task}",
                                  model=str(tmp_path / "dense"), seed=42, status="done",
                                  metrics={"accuracy" if task == "rte" else "matthews_corr": value, "score": value},
                                  group=name, pretrain_metrics={"eval_loss": 3.0, "perplexity": 20.1}))
    registry.record(RunRecord(run_dir=str(tmp_path / "sst2"), experiment="glue_from=dense~sst2", task="glue:sst2",
                              model=str(tmp_path / "dense"), seed=42, status="done",
                              metrics={"accuracy": 0.8, "score": 0.8}, group="glue_from=dense~sst2",
                              pretrain_metrics={"eval_loss": 3.0, "perplexity": 20.1}))  # no other rate
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "log_history.json").write_text(json.dumps(
        [{"eval_loss": 10.4, "step": 0}, {"loss": 7.0, "step": 50}, {"eval_loss": 6.1, "step": 500},
         {"eval_loss": 5.2, "step": 1000}, {"eval_loss": 4.0, "step": 1500}]))
    script = _script()
    reader = RunRegistry.in_output_root(tmp_path, read_only=True)
    mlm = script.mlm_table(reader.runs(task_prefix="mlm"), tmp_path)  # the run copied here from elsewhere
    assert "| `dense` | 8000 | 3.000 | – | 20.1 | 50.0 % | dense | 9000 | 0 | 1000 |" in mlm
    glue = script.study_glue_records(reader)
    assert {r.label for r in glue} == {"glue_from=dense"} and len(glue) == 5
    table = script.glue_table(glue, agg="mean")
    assert sum(line.startswith("| glue_from=dense ") for line in table.splitlines()) == 1
    grid, best = script.lr_grid_records(reader)
    labels = [r.label for r in grid]  # by learning rate, the default one included, in numeric order
    assert labels == ["glue_from=dense lr=5e-05"] * 4 + ["glue_from=dense lr=1e-04"] + ["glue_from=dense lr=2e-04"] * 2
    # RTE: lr 1e-4 (0.7) beats 5e-05 (mean 0.605) and 2e-4 (0.5); CoLA: 5e-05 (mean 0.205) beats 2e-4 (0.1)
    chosen = {(r.task, r.experiment) for r in best}
    assert chosen == {("glue:rte", "glue_from=dense~rte~lr1e-4"), ("glue:cola", "glue_from=dense~cola"),
                      ("glue:sst2", "glue_from=dense~sst2")}  # SST-2, at one rate, is in the best row, not the grid
    assert len(best) == 4 and {r.label for r in best} == {"glue_from=dense best lr"}


def test_a_sparse_run_is_compared_with_the_dense_run_that_differs_in_sparsity_alone(tmp_path):
    """The gap column pairs runs by config.json: name, description and the sparsity sections may differ, nothing
    else (another seed has no twin, even with every other setting equal)."""
    base = {"seed": 42, "train": {"max_steps": 8000}, "kd": {"teacher": "t", "hidden_weight": 1.0},
            "sparsity": None, "gmp": None, "rigl": None}
    sparse = {"sparsity": {"sparsity": 0.8}, "gmp": {"end_fraction": 0.9}}
    runs = {"dense": (base, None, 2.661), "dense_nokd": ({**base, "kd": None}, None, 3.0),
            "gmp": ({**base, **sparse}, 0.8, 2.758), "gmp_seed43": ({**base, **sparse, "seed": 43}, 0.8, 2.624)}
    registry = RunRegistry.in_output_root(tmp_path)
    for name, (config, sparsity, loss) in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"name": name, "description": name, **config}))
        registry.record(RunRecord(run_dir=str(tmp_path / name), experiment=name, task="mlm", model="medium",
                                  seed=config["seed"], status="done", sparsity=sparsity,
                                  metrics={"eval_loss": loss, "global_step": 8000}))
    mlm = _script().mlm_table(RunRegistry.in_output_root(tmp_path, read_only=True).runs(task_prefix="mlm"), tmp_path)
    gap = {line.split(" | ")[0].strip("| `"): line.split(" | ")[3] for line in mlm.splitlines()[2:]}
    assert gap == {"dense": "–", "dense_nokd": "–", "gmp": "+0.097", "gmp_seed43": "no twin"}


def test_raw_files_keep_every_evaluation_the_masks_and_each_glue_row(tmp_path, monkeypatch, capsys):
    """--raw: what docs/data keeps behind the tables, read back as JSON (a run copied here from elsewhere)."""
    root, raw = tmp_path / "study", tmp_path / "raw"
    registry = RunRegistry.in_output_root(root)
    for name, sparsity, nonzero in (("dense", None, None), ("gmp", 0.8, 20), ("gmp_leaky", 0.8, 21)):
        registry.record(RunRecord(run_dir=f"/elsewhere/{name}", experiment=name, task="mlm", model="medium", seed=42,
                                  status="done", sparsity=sparsity, metrics={"eval_loss": 3.0, "global_step": 8000}))
        (root / name).mkdir()
        (root / name / "log_history.json").write_text(json.dumps(
            [{"eval_loss": 10.4, "step": 0}, {"loss": 7.0, "step": 50}, {"eval_loss": 6.1, "step": 500}]))
        if sparsity:
            (root / name / "sparsity.json").write_text(json.dumps(
                {"selected": {"active": 20, "nonzero": nonzero, "total": 100, "sparsity": sparsity}}))
    registry.record(RunRecord(run_dir=str(root / "glue_from=gmp~rte" / "run0"), experiment="glue_from=gmp~rte",
                              task="glue:rte", model=str(root / "gmp"), seed=43, status="done",
                              metrics={"accuracy": 0.6, "score": 0.6}, group="glue_from=gmp~rte",
                              pretrain_metrics={"eval_loss": 3.0}, git_commit="abc"))
    monkeypatch.setattr("sys.argv", ["pretrain_study_table.py", str(root), "--raw", str(raw)])
    assert _script().main() == 0
    assert (raw / "tables.md").read_text().rstrip("\n") == capsys.readouterr().out.rstrip("\n")
    metrics = json.loads((raw / "metrics.json").read_text())
    assert metrics["gmp"]["eval_loss_by_step"] == {"0": 10.4, "500": 6.1}
    assert [metrics[n]["masked_weights_zero"] for n in ("dense", "gmp", "gmp_leaky")] == [None, True, False]
    assert metrics["gmp"]["sparsity"] == 0.8 and metrics["dense"]["eval_loss"] == 3.0
    (row,) = json.loads((raw / "glue_runs.json").read_text())
    assert row == {"run_dir": str(root / "glue_from=gmp~rte" / "run0"), "experiment": "glue_from=gmp~rte",
                   "task": "glue:rte", "model": str(root / "gmp"), "seed": 43, "status": "done",
                   "metrics": {"accuracy": 0.6, "score": 0.6}, "git_commit": "abc"}
