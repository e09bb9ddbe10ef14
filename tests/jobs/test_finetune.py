"""Finetuning end to end on CPU with the real MiniLM on small slices of the real GLUE, SQuAD, GAP files."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from tiny_glue_checks import check_tiny_glue_outputs

from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.results import RunRegistry
from sparsebert.runner import RunOptions, run_experiment

pytestmark = pytest.mark.slow

# The tiny experiments as shipped, but with 32 training rows instead of 96-192 (2 optimizer steps at their batch
# of 16): no assertion here depends on how much the model learned, and the evaluation slices (predictions,
# metrics, submission files) keep their shipped sizes. CPU time in these tests is almost all training steps.
FEW_TRAIN_ROWS = ["finetune.max_train_samples=32"]


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


@pytest.fixture(scope="module")
def glue_root(registry, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("glue")
    run_experiment(registry.build("tiny_glue", FEW_TRAIN_ROWS), RunOptions(output_root=out, data_dir=data_dir))
    return out


def test_tiny_glue_writes_every_run_and_registers_it(glue_root, data_dir):
    root = glue_root / "tiny_glue"
    check_tiny_glue_outputs(root, eval_rows=64, data_dir=data_dir)  # max_eval_samples
    seeds = [json.loads((root / r / "config.json").read_text())["seed"]
             for r in ("glue_rte/run0", "glue_rte/run1", "glue_stsb/run0")]
    assert seeds == [42, 43, 42]
    records = RunRegistry.in_output_root(glue_root).runs(experiments=["tiny_glue"])
    assert sorted((r.task, r.seed) for r in records) == [("glue:rte", 42), ("glue:rte", 43), ("glue:stsb", 42)]
    summary = json.loads((root / "metrics.json").read_text())
    assert summary["glue:rte"]["runs"] == 2 and (root / "DONE").is_file()


def test_parallel_runs_train_the_same_runs_in_processes_of_their_own(registry, glue_root, data_dir, tmp_path,
                                                                     caplog):
    """finetune.parallel_runs=2: two STS-B runs (seeds 42, 43) in two worker processes, each with the files and
    registry row of a run trained in this process; seed 42 gives the metrics of glue_root's run (threads aside).
    How many run at once is no setting of the runs: a finished job is not refused for another number."""
    sets = [*FEW_TRAIN_ROWS, 'finetune.glue_tasks=["stsb"]', 'finetune.runs_per_task={"stsb": 2}']
    with caplog.at_level("INFO", logger="sparsebert"):
        run_experiment(registry.build("tiny_glue", [*sets, "finetune.parallel_runs=2"]),
                       RunOptions(output_root=tmp_path, data_dir=data_dir))
    assert sum("in a process of its own (2 at once)" in m for m in caplog.messages) == 2
    assert run_experiment(registry.build("tiny_glue", sets), RunOptions(output_root=tmp_path, data_dir=data_dir)) is None
    runs = [json.loads((tmp_path / "tiny_glue" / "glue_stsb" / f"run{k}" / "metrics.json").read_text()) for k in (0, 1)]
    alone = json.loads((glue_root / "tiny_glue" / "glue_stsb" / "run0" / "metrics.json").read_text())
    assert runs[0]["pearson"] == pytest.approx(alone["pearson"], rel=1e-4)
    assert runs[1]["pearson"] != pytest.approx(alone["pearson"], rel=1e-4)  # run 1 has its own seed
    assert (tmp_path / "tiny_glue" / "glue_stsb" / "run1" / "predictions_dev.tsv").is_file()
    rows = RunRegistry.in_output_root(tmp_path).runs(experiments=["tiny_glue"])
    assert sorted((r.task, r.seed, r.status) for r in rows) == [("glue:stsb", 42, "done"), ("glue:stsb", 43, "done")]


@pytest.mark.parametrize(("world", "callbacks", "message"), [
    ("1", [object()], "in worker processes, which this job's callbacks"),  # --profile's: this process only
    ("2", [], r"under accelerate launch / torchrun \(2 processes\)"),
])
def test_parallel_runs_are_refused_where_worker_processes_cannot_follow(registry, data_dir, tmp_path, monkeypatch,
                                                                         world, callbacks, message):
    from sparsebert.errors import SparseBertError
    from sparsebert.jobs.finetune.job import FinetuneJob

    monkeypatch.setenv("WORLD_SIZE", world)
    job = FinetuneJob(registry.build("tiny_glue", ["finetune.parallel_runs=2"]), data_dir, tmp_path, callbacks=callbacks)
    with pytest.raises(SparseBertError, match=f"finetune.parallel_runs=2 .*{message}"):
        job.prepare()


def test_parallel_runs_start_with_the_most_training(registry, data_dir, tmp_path, monkeypatch):
    """Side by side, the runs are handed out by training rows x epochs, the largest first: the job does not end
    with its longest run alone on the GPU. Here STS-B (96 rows, 3 epochs) before RTE (96 rows, 1 epoch)."""
    from sparsebert.jobs.finetune import job as job_module

    handed_out = []

    def record(target, calls, workers, names, gpus):
        assert gpus == ["0", "1"]  # the machine's GPUs: the workers spread over them
        handed_out.extend(names)
        raise KeyboardInterrupt  # stop before training: the order is all this test is about

    monkeypatch.setattr(job_module, "run_in_processes", record)
    monkeypatch.setattr(job_module, "visible_gpus", lambda: ["0", "1"])
    sets = ['finetune.glue_tasks=["rte", "stsb"]', 'finetune.runs_per_task={"rte": 2}',
            'finetune.epochs_per_task={"rte": 1, "stsb": 3}', "finetune.max_train_samples=96",
            "finetune.parallel_runs=2"]
    job = job_module.FinetuneJob(registry.build("tiny_glue", sets), data_dir, tmp_path)
    job.prepare()
    assert [job.work(t) for t in job.tasks] == [96, 288]
    with pytest.raises(KeyboardInterrupt):
        job.train(tmp_path / "tiny_glue", resume=False)
    assert handed_out == ["tiny_glue glue:stsb run0", "tiny_glue glue:rte run0", "tiny_glue glue:rte run1"]
    # runs counted in steps train on steps x batch rows each: the same for every task, and nothing to sort by
    by_steps = job_module.FinetuneJob(registry.build("tiny_glue", [
        *sets[:2], "finetune.max_train_samples=96", "finetune.parallel_runs=2", "train.epochs=null",
        "train.max_steps=3"]), data_dir, tmp_path)
    by_steps.prepare()
    assert [by_steps.work(t) for t in by_steps.tasks] == [48, 48]


def test_glue_table_from_the_registry(glue_root, capsys):
    assert cli_main(["--table", "glue", "--output-dir", str(glue_root), "--agg", "mean"]) == 0
    table = capsys.readouterr().out
    assert "| tiny_glue" in table and "average_bert over: rte, stsb (2 tasks)" in table
    # a misspelled experiment is an error, not a silently missing row
    assert cli_main(["--table", "glue", "--output-dir", str(glue_root), "--only", "tiny_glue",
                     "tiny_glu"]) == 2
    assert "no finished GLUE runs of tiny_glu" in capsys.readouterr().err


def test_resume_reruns_only_unfinished_runs(registry, glue_root, data_dir):
    root = glue_root / "tiny_glue"
    kept = (root / "glue_rte/run0/metrics.json").stat().st_mtime_ns
    (root / "glue_rte/run1/DONE").unlink()
    (root / "DONE").unlink()
    run_experiment(registry.build("tiny_glue", FEW_TRAIN_ROWS),
                   RunOptions(output_root=glue_root, data_dir=data_dir, resume=True))
    assert (root / "glue_rte/run1/DONE").is_file() and (root / "DONE").is_file()
    assert (root / "glue_rte/run0/metrics.json").stat().st_mtime_ns == kept  # finished run not redone


def _finished_run(experiment: str, registry, data_dir, tmp_path_factory) -> tuple[Path, dict]:
    """``experiment`` run once with FEW_TRAIN_ROWS: its output root and summary."""
    out = tmp_path_factory.mktemp(experiment)
    summary = run_experiment(registry.build(experiment, FEW_TRAIN_ROWS), RunOptions(output_root=out, data_dir=data_dir))
    return out, summary


@pytest.fixture(scope="module")
def squad_root(registry, data_dir, tmp_path_factory) -> tuple[Path, dict]:
    """A finished tiny_squad run (and its summary): tested below, then the teacher of tiny_squad_kd."""
    return _finished_run("tiny_squad", registry, data_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def gap_root(registry, data_dir, tmp_path_factory) -> tuple[Path, dict]:
    """A finished tiny_gap run (and its summary): tested below, then the teacher of tiny_gap_kd."""
    return _finished_run("tiny_gap", registry, data_dir, tmp_path_factory)


def test_tiny_squad_predictions_and_metrics(squad_root, registry, data_dir):
    """The run predicts every question of its evaluation articles, and its metrics are those of the predictions
    it wrote against the gold answers of those questions."""
    from sparsebert.data.squad import read_squad, split_by_article
    from sparsebert.jobs.finetune.squad import squad_metrics

    root, summary = squad_root
    run = root / "tiny_squad" / "squad_v1" / "run0"
    predictions = json.loads((run / "predictions.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    cfg = registry.build("tiny_squad", FEW_TRAIN_ROWS)
    _, held_out = split_by_article(read_squad(data_dir / cfg.finetune.squad_file), cfg.finetune.squad_eval_fraction,
                                   cfg.seed)
    gold = held_out[:cfg.finetune.max_eval_samples]
    assert metrics["total"] == len(gold) == 48
    assert set(predictions) == {ex["id"] for ex in gold}
    expected = squad_metrics(gold, predictions, version_2=False)
    assert (metrics["exact"], metrics["f1"]) == pytest.approx((expected["exact"], expected["f1"]))
    assert 0.0 <= metrics["exact"] <= metrics["f1"] <= 100.0
    assert summary["squad_v1"]["f1"]["mean"] == pytest.approx(metrics["f1"])


def test_tiny_gap_writes_submission_and_scorer_file(gap_root):
    root, _ = gap_root
    run = root / "tiny_gap" / "gap" / "run0"
    lines = (run / "submission.csv").read_text().splitlines()
    assert lines[0] == "ID,A,B,NEITHER" and len(lines) == 49
    system = [line.split("\t") for line in (run / "gap_system.tsv").read_text().splitlines()]
    assert len(system) == 48 and all(a in ("TRUE", "FALSE") and b in ("TRUE", "FALSE") for _, a, b in system)
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"accuracy", "log_loss", "f1", "f1_masculine", "f1_feminine", "bias"} <= set(metrics)
    cm = metrics["confusion_matrix"]  # gold A / B / Neither by predicted; every evaluated row counted once
    assert len(cm) == 3 and sum(map(sum, cm)) == 48
    assert sum(cm[i][i] for i in range(3)) / 48 == pytest.approx(metrics["accuracy"])
    assert (run / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_csv_folds_aggregates_and_reports(registry, data_dir, tmp_path):
    run_experiment(registry.build("tiny_csv", FEW_TRAIN_ROWS), RunOptions(output_root=tmp_path, data_dir=data_dir))
    run = tmp_path / "tiny_csv" / "csv" / "run0"
    metrics = json.loads((run / "metrics.json").read_text())
    with open(run / "test_predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == metrics["test_rows"] and metrics["test_chunks"] > metrics["test_rows"]  # folded
    assert sum(map(sum, metrics["confusion_matrix"])) == metrics["test_rows"]
    assert (run / "confusion_matrix.png").stat().st_size > 1000
    assert json.loads((run / "epochs.json").read_text())[0]["epoch"] == 1


GLUE_FROM_SPARSE = ["finetune.glue_tasks=[\"rte\"]", "finetune.max_train_samples=32", "finetune.max_eval_samples=16",
                    "train.epochs=1", "train.global_batch_size=16", "train.dataloader_workers=0"]


@pytest.fixture(scope="module")
def glue_from_sparse(registry, data_dir, tmp_path_factory) -> Path:
    """A tiny sparse RigL pretraining run, and RTE finetuned from it, in one output root."""
    out = tmp_path_factory.mktemp("glue_from_sparse")
    fast = ["data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16", "data.max_seq_length=64",
            "train.global_batch_size=8", "train.max_steps=6", "train.eval_steps=3", "train.save_steps=3",
            "train.report_to=[]", "model.tokenizer=minilm", "rigl.update_freq=2"]  # RigL must update in 6 steps
    run_experiment(registry.build("sparse_tiny_rigl", fast), RunOptions(output_root=out, data_dir=data_dir))
    cfg = registry.build("glue_from=sparse_tiny_rigl", GLUE_FROM_SPARSE)
    assert cfg.name == "glue_from=sparse_tiny_rigl" and cfg.model.init_from == "sparse_tiny_rigl"
    run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir))
    return out


def test_glue_from_a_sparse_run_keeps_its_masks(glue_from_sparse):
    run = glue_from_sparse / "glue_from=sparse_tiny_rigl" / "glue_rte" / "run0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-3)  # masks from the pretraining run, kept fixed
    report = json.loads((run / "sparsity.json").read_text())
    assert report["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    # the run records the sparsity it inherited; the experiment's config.json keeps what was asked for
    assert json.loads((run / "config.json").read_text())["sparsity"]["init"] == "zeros"
    assert json.loads((run.parents[1] / "config.json").read_text())["sparsity"] is None


def test_glue_from_a_sparse_run_resumes(registry, data_dir, glue_from_sparse):
    root = glue_from_sparse / "glue_from=sparse_tiny_rigl"
    (root / "glue_rte/run0/DONE").unlink()
    (root / "DONE").unlink()
    cfg = registry.build("glue_from=sparse_tiny_rigl", GLUE_FROM_SPARSE)
    summary = run_experiment(cfg, RunOptions(output_root=glue_from_sparse, data_dir=data_dir, resume=True))
    assert (root / "glue_rte/run0/DONE").is_file() and (root / "DONE").is_file()
    assert summary["glue:rte"]["sparsity"]["mean"] == pytest.approx(0.8, abs=1e-3)  # still sparse when redone
    assert cfg.sparsity is None  # the job did not change the experiment it was given


def test_tiny_squad_v2_reports_hasans_and_noans(registry, data_dir, tmp_path):
    """minilm_squad_v2 as shipped (its task and file), at tiny_squad's size."""
    tiny = registry.build("tiny_squad")
    shrink = [f"train.{k}={getattr(tiny.train, k)}" for k in ("epochs", "global_batch_size", "logging_steps",
                                                              "dataloader_workers")]
    shrink += [f"finetune.{k}={getattr(tiny.finetune, k)}" for k in ("max_seq_length", "doc_stride",
                                                                     "max_eval_samples")]
    cfg = registry.build("minilm_squad_v2", [*shrink, *FEW_TRAIN_ROWS])
    assert cfg.task == "squad_v2" and cfg.finetune.squad_file == "squad/dev-v2.0.reconstructed.json"
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))
    run = tmp_path / "minilm_squad_v2" / "squad_v2" / "run0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["HasAns_total"] + metrics["NoAns_total"] == metrics["total"] == 48
    predictions = json.loads((run / "predictions.json").read_text())
    assert set(json.loads((run / "null_odds.json").read_text())) == set(predictions)
    # the best null-odds threshold on the eval set, beside the fixed one: at least as good
    assert metrics["null_score_diff_threshold"] == 0.0
    assert metrics["exact"] <= metrics["best_exact"] <= 100 and metrics["f1"] <= metrics["best_f1"] <= 100
    nbest = json.loads((run / "nbest_predictions.json").read_text())
    assert set(nbest) == set(predictions)
    for qid, candidates in nbest.items():  # the best span first (a v2 run's "" answer where the odds said so)
        assert predictions[qid] in ("", candidates[0]["text"]) and len(candidates) <= 20
        assert sum(c["probability"] for c in candidates) == pytest.approx(1.0)


def test_glue_test_split_gets_leaderboard_predictions(registry, data_dir, tmp_path):
    """A GLUE directory with test.tsv (no labels) gets a leaderboard-format prediction file."""
    rte = tmp_path / "data" / "glue" / "RTE"
    rte.mkdir(parents=True)
    for split in ("train", "dev"):
        (rte / f"{split}.tsv").write_text((data_dir / "glue" / "RTE" / f"{split}.tsv").read_text())
    dev = (data_dir / "glue" / "RTE" / "dev.tsv").read_text().splitlines()
    (rte / "test.tsv").write_text("\n".join("\t".join(line.split("\t")[:3]) for line in dev[:21]) + "\n")
    cfg = registry.build("tiny_glue", ["finetune.glue_tasks=[\"rte\"]", "finetune.runs_per_task={}", *FEW_TRAIN_ROWS])
    run_experiment(cfg, RunOptions(output_root=tmp_path / "out", data_dir=tmp_path / "data"))
    lines = (tmp_path / "out" / "tiny_glue" / "glue_rte" / "run0" / "test" / "RTE.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 21
    assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "not_entailment"}


@pytest.mark.parametrize("student, teacher, task", [("tiny_gap_kd", "tiny_gap", "gap"),
                                                     ("tiny_squad_kd", "tiny_squad", "squad_v1")])
def test_distillation_from_a_finetuned_teacher(registry, data_dir, request, student, teacher, task):
    """The student distills from the finished teacher run in its output root: the tiny_gap / tiny_squad run of the
    gap_root / squad_root fixture, tested above."""
    from sparsebert.trainer.trainer import SparseBertTrainer

    root, _ = request.getfixturevalue(f"{teacher.removeprefix('tiny_')}_root")
    assert (root / teacher / task / "run0" / "DONE").is_file()

    seen = []
    original = SparseBertTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        seen.append(self.teacher is not None and model.training)
        return original(self, model, inputs, *args, **kwargs)

    opts = RunOptions(output_root=root, data_dir=data_dir)
    SparseBertTrainer.compute_loss = spy
    try:
        run_experiment(registry.build(student, FEW_TRAIN_ROWS), opts)
    finally:
        SparseBertTrainer.compute_loss = original
    assert any(seen)  # the teacher was used for the training losses
    metrics = json.loads((root / student / task / "run0" / "metrics.json").read_text())
    assert metrics["global_step"] > 0


def test_two_four_masks_hold_through_finetuning(registry, data_dir, tmp_path):
    """A 2:4 run trains, stays 2:4 in every encoder Linear of the saved model, and says so in sparsity.json."""
    from transformers import AutoModelForSequenceClassification

    from sparsebert.export import is_two_four
    from sparsebert.sparsity.config import DEFAULT_INCLUDE

    run_experiment(registry.build("tiny_glue_2to4", FEW_TRAIN_ROWS), RunOptions(output_root=tmp_path, data_dir=data_dir))
    run = tmp_path / "tiny_glue_2to4" / "glue_rte" / "run0"
    report = json.loads((run / "sparsity.json").read_text())
    assert report["pattern"] == "2:4" and report["headline"].startswith("2:4 semi-structured (50.0% sparse)")
    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    encoder = {n: p for n, p in model.named_parameters() if any(re.search(pat, n) for pat in DEFAULT_INCLUDE)}
    assert model.config.num_hidden_layers == 2  # tiny_glue keeps MiniLM's first two layers
    assert len(encoder) == 12  # 2 layers x (Q, K, V, attention output, intermediate, output)
    assert all(is_two_four(p) for p in encoder.values())
    assert all(abs((p == 0).float().mean().item() - 0.5) < 1e-6 for p in encoder.values())


def test_sparse_recipe_prunes_the_teacher_and_rewinds_the_learning_rate(registry, data_dir, glue_root):
    """tiny_glue_sparse80 starts from the finished tiny_glue RTE run (its teacher), ends 80 % sparse, and its
    learning rate jumps back up when pruning ends (a plain linear schedule only ever decreases)."""
    from transformers import TrainerCallback

    class LearningRates(TrainerCallback):
        def __init__(self):
            self.rates = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "learning_rate" in logs:
                self.rates.append(logs["learning_rate"])

    logged = LearningRates()
    cfg = registry.build("tiny_glue_sparse80", [*FEW_TRAIN_ROWS, "train.logging_steps=1"])
    run_experiment(cfg, RunOptions(output_root=glue_root, data_dir=data_dir), callbacks=[logged])
    run = glue_root / "tiny_glue_sparse80" / "glue_rte" / "run0"
    report = json.loads((run / "sparsity.json").read_text())
    assert report["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert len(logged.rates) == 4  # 32 rows, batch 16, 2 epochs: pruning ends at step 2 of 4
    rises = [k for k in range(1, 4) if logged.rates[k] > logged.rates[k - 1]]
    assert len(rises) == 1 and logged.rates[rises[0]] == pytest.approx(cfg.train.learning_rate)  # back to the peak


@pytest.mark.parametrize("name", ["up80", "up80/model", "ABS/up80", "ABS/up80/model"])
def test_a_sparse_run_named_by_its_model_directory_keeps_its_masks(tmp_path, name):
    """init_from may name the run or the model/ it exported (resolve_pretrained loads the same weights): both
    finetune with the run's masks fixed, and bring its MLM numbers to the results row."""
    from sparsebert.results.runs import pretrain_metrics_of, resolve_pretrained, sparsity_of_run

    run = tmp_path / "up80"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"task": "mlm", "sparsity": {"sparsity": 0.8}}))
    (run / "metrics.json").write_text(json.dumps({"eval_loss": 3.1, "perplexity": 22.2}))
    (run / "DONE").write_text("")
    name = name.replace("ABS", str(tmp_path))
    assert resolve_pretrained(name, tmp_path) == str(run / "model")
    config = sparsity_of_run(name, tmp_path)
    assert config is not None and (config.sparsity, config.init) == (0.8, "zeros")
    assert pretrain_metrics_of(name, tmp_path) == {"eval_loss": 3.1, "perplexity": 22.2}


def test_finetuning_a_run_pretrained_with_rescale_init_reads_its_masks_from_zeros(tmp_path):
    from sparsebert.results.runs import sparsity_of_run

    run = tmp_path / "small_wiki_sparse_80_rigl_rescaled"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"sparsity": {"sparsity": 0.8, "rescale_init": True}}))
    (run / "DONE").write_text("")
    config = sparsity_of_run(run.name, tmp_path)
    config.validate()  # the pretraining run's rescale_init is no setting of a start from trained weights
    assert (config.init, config.rescale_init, config.sparsity) == ("zeros", False, 0.8)
