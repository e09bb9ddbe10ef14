"""``run.py --predict``: tiny finished runs of every task predict an unlabelled and a labelled copy of a slice of
the real file they were evaluated on; the predictions equal the ones the run wrote for those rows, metrics come
with labels, and bad requests are one-line refusals that write nothing."""

from __future__ import annotations

import csv
import errno
import json
import os
from pathlib import Path

import pytest

from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.data.csv_task import CsvTaskConfig, read_csv_task
from sparsebert.data.gap import read_gap
from sparsebert.data.squad import read_squad
from sparsebert.errors import SparseBertError
from sparsebert.runner import RunOptions, run_experiment

pytestmark = pytest.mark.slow

FEW_TRAIN_ROWS = ["finetune.max_train_samples=32"]  # as in test_finetune: nothing here depends on learning


def _finished(experiment: str, overrides: list[str], run: str, data_dir: Path, tmp_path_factory) -> Path:
    """The run directory ``run`` of ``experiment`` trained once with FEW_TRAIN_ROWS."""
    out = tmp_path_factory.mktemp(experiment)
    registry = ExperimentRegistry.builtin()
    run_experiment(registry.build(experiment, [*FEW_TRAIN_ROWS, *overrides]),
                   RunOptions(output_root=out, data_dir=data_dir))
    return out / experiment / run


@pytest.fixture(scope="module")
def rte_run(data_dir, tmp_path_factory) -> Path:
    return _finished("tiny_glue", ['finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}"], "glue_rte/run0",
                     data_dir, tmp_path_factory)


def _predict(capsys, run: Path, input_file: Path, *extra: str) -> tuple[str, dict[str, float]]:
    """cli_main --predict; its stdout and the metrics line it printed, parsed ({} if none)."""
    assert cli_main(["--predict", str(run), "--input", str(input_file), *extra]) == 0
    out = capsys.readouterr().out
    line = next((x for x in out.splitlines() if x.startswith("metrics: ")), "")
    metrics = dict(kv.split("=") for kv in line.removeprefix("metrics: ").split(", ") if kv)
    return out, {k: float(v) for k, v in metrics.items()}


def _tsv(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_glue_predicts_the_leaderboard_file(rte_run, data_dir, tmp_path, capsys):
    dev = _tsv(data_dir / "glue/RTE/dev.tsv")[:65]  # header + the 64 rows the run evaluated (max_eval_samples)
    labelled, unlabelled = tmp_path / "rte_dev.tsv", tmp_path / "rte_test.tsv"
    labelled.write_text("".join("\t".join(r) + "\n" for r in dev))
    unlabelled.write_text("".join("\t".join(r[:3]) + "\n" for r in dev))  # index, sentence1, sentence2

    out, metrics = _predict(capsys, rte_run, unlabelled)
    written = rte_run / "predict" / "rte_test.tsv"  # the default output
    assert f"wrote {written}" in out and not metrics
    rows = _tsv(written)
    assert rows[0] == ["index", "prediction"] and [r[0] for r in rows[1:]] == [r[0] for r in dev[1:]]
    at_training = {r[0]: ("entailment", "not_entailment")[int(r[1])] for r in _tsv(rte_run / "predictions_dev.tsv")[1:]}
    assert {i: p for i, p in rows[1:]} == at_training

    _, metrics = _predict(capsys, rte_run, labelled, "--output", str(tmp_path / "out" / "rte.tsv"))
    assert (tmp_path / "out" / "rte.tsv").read_text() == written.read_text()
    assert metrics["accuracy"] == pytest.approx(json.loads((rte_run / "metrics.json").read_text())["accuracy"],
                                                abs=1e-4)


@pytest.fixture(scope="module")
def csv_run(data_dir, tmp_path_factory) -> Path:
    return _finished("tiny_csv", [], "csv/run0", data_dir, tmp_path_factory)


def test_csv_predicts_folded_rows_with_probabilities(csv_run, data_dir, tmp_path, capsys):
    # the run's test rows (row ids = data row numbers of SST-2 dev), in its order, as a file of their own
    with open(csv_run / "test_predictions.csv") as f:
        at_training = list(csv.DictReader(f))
    dev = _tsv(data_dir / "glue/SST-2/dev.tsv")  # sentence, label
    rows = [dev[1 + int(r["row_id"])] for r in at_training]
    labelled, unlabelled = tmp_path / "sst.tsv", tmp_path / "sst_unlabelled.tsv"
    labelled.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    unlabelled.write_text("sentence\n" + "".join(f"{s}\n" for s, _ in rows))

    _, metrics = _predict(capsys, csv_run, unlabelled)
    with open(csv_run / "predict" / "sst_unlabelled.csv") as f:
        predicted = list(csv.DictReader(f))
    assert list(predicted[0]) == ["row_id", "prediction", "prob_0", "prob_1"] and not metrics
    assert [r["row_id"] for r in predicted] == [str(i) for i in range(len(rows))]  # one row per input row
    for p, t in zip(predicted, at_training):
        assert p["prediction"] == t["prediction"]
        assert float(p["prob_0"]) == pytest.approx(float(t["prob_0"]), abs=2e-6)
        assert float(p["prob_0"]) + float(p["prob_1"]) == pytest.approx(1.0, abs=2e-6)

    _, metrics = _predict(capsys, csv_run, labelled)
    run_metrics = json.loads((csv_run / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(run_metrics["accuracy"], abs=1e-4)
    assert metrics["rows"] == len(rows) and metrics["chunks"] == run_metrics["test_chunks"] > len(rows)  # folded
    with open(csv_run / "predict" / "sst.csv") as f:
        assert next(csv.reader(f)) == ["row_id", "truth", "prediction", "prob_0", "prob_1"]


@pytest.fixture(scope="module")
def squad_run(data_dir, tmp_path_factory) -> Path:
    return _finished("tiny_squad", [], "squad_v1/run0", data_dir, tmp_path_factory)


def test_squad_predicts_answers_and_nbest(squad_run, data_dir, tmp_path, capsys):
    at_training = json.loads((squad_run / "predictions.json").read_text())
    data = json.loads((data_dir / "squad/dev-v1.1.json").read_text())
    articles = []  # the questions the run evaluated, in the file's layout
    for article in data["data"]:
        paragraphs = [{"context": p["context"], "qas": [q for q in p["qas"] if q["id"] in at_training]}
                      for p in article["paragraphs"]]
        paragraphs = [p for p in paragraphs if p["qas"]]
        if paragraphs:
            articles.append({"title": article["title"], "paragraphs": paragraphs})
    labelled, unlabelled = tmp_path / "squad_dev.json", tmp_path / "squad_test.json"
    labelled.write_text(json.dumps({"version": "1.1", "data": articles}))
    for article in articles:
        for p in article["paragraphs"]:
            for q in p["qas"]:
                del q["answers"]
    unlabelled.write_text(json.dumps({"version": "1.1", "data": articles}))

    out, metrics = _predict(capsys, squad_run, unlabelled, "--output", str(tmp_path / "pred.json"))
    assert not metrics and f"wrote {tmp_path / 'pred_nbest_predictions.json'}" in out
    assert json.loads((tmp_path / "pred.json").read_text()) == at_training  # every id, the same answers
    nbest = json.loads((tmp_path / "pred_nbest_predictions.json").read_text())
    assert set(nbest) == set(at_training)
    for qid, candidates in nbest.items():
        assert candidates[0]["text"] == at_training[qid] and len(candidates) <= 20  # finetune.n_best_size
        assert sum(c["probability"] for c in candidates) == pytest.approx(1.0)

    _, metrics = _predict(capsys, squad_run, labelled)
    run_metrics = json.loads((squad_run / "metrics.json").read_text())
    assert metrics["total"] == 48 and metrics["f1"] == pytest.approx(run_metrics["f1"], abs=1e-3)


@pytest.fixture(scope="module")
def gap_run(data_dir, tmp_path_factory) -> Path:
    return _finished("tiny_gap", [], "gap/run0", data_dir, tmp_path_factory)


def test_gap_predicts_the_kaggle_submission(gap_run, data_dir, tmp_path, capsys):
    rows = _tsv(data_dir / "gap/gap-validation.tsv")[:49]  # header + the 48 rows the run evaluated
    labelled, unlabelled = tmp_path / "gap_dev.tsv", tmp_path / "gap_test.tsv"
    labelled.write_text("".join("\t".join(r) + "\n" for r in rows))
    # the Kaggle test file's 9 columns: no A-coref (6), no B-coref (9)
    unlabelled.write_text("".join("\t".join(r[:6] + r[7:9] + r[10:]) + "\n" for r in rows))

    _, metrics = _predict(capsys, gap_run, unlabelled)
    submission = (gap_run / "predict" / "gap_test.csv").read_text().splitlines()
    at_training = (gap_run / "submission.csv").read_text().splitlines()
    assert submission[0] == "ID,A,B,NEITHER" and not metrics
    assert [s.split(",")[0] for s in submission[1:]] == [r[0] for r in rows[1:]]
    for mine, theirs in zip(submission[1:], at_training[1:], strict=True):
        probs = [float(x) for x in mine.split(",")[1:]]
        assert probs == pytest.approx([float(x) for x in theirs.split(",")[1:]], abs=1e-6)
        assert sum(probs) == pytest.approx(1.0)
    system = (gap_run / "predict" / "gap_test_gap_system.tsv").read_text()
    assert system == (gap_run / "gap_system.tsv").read_text()

    _, metrics = _predict(capsys, gap_run, labelled)
    run_metrics = json.loads((gap_run / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(run_metrics["accuracy"], abs=1e-4)
    assert metrics["log_loss"] == pytest.approx(run_metrics["log_loss"], abs=1e-3)


def _refused(capsys, argv: list[str], message: str) -> None:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_bad_requests_are_refused_before_anything_is_written(rte_run, gap_run, data_dir, tmp_path, capsys):
    gap_file, rte_file = data_dir / "gap/gap-validation.tsv", data_dir / "glue/RTE/dev.tsv"
    runs = {}
    for name, config, done in [("unfinished", {"task": "gap", "experiment": "x"}, False),
                               ("pretraining", {"task": "mlm"}, True),
                               ("experiment", {"task": "gap"}, True),
                               ("other_task", {"task": "ner", "experiment": "x"}, True)]:
        runs[name] = tmp_path / name
        runs[name].mkdir()
        (runs[name] / "config.json").write_text(json.dumps(config))
        if done:
            (runs[name] / "DONE").write_text("x\n")
    cases = [
        (["--predict", str(runs["unfinished"]), "--input", str(gap_file)], "has not finished"),
        (["--predict", str(runs["pretraining"]), "--input", str(gap_file)], "is a pretraining run"),
        (["--predict", str(runs["experiment"]), "--input", str(gap_file)], "is an experiment directory"),
        (["--predict", str(runs["other_task"]), "--input", str(gap_file)], "task ner, which has no predict"),
        (["--predict", "no/such/run0", "--input", str(gap_file), "--output-dir", str(tmp_path)], "no run directory"),
        (["--predict", str(rte_run), "--input", str(tmp_path / "missing.tsv")], "no such file"),
        (["--predict", str(rte_run), "--input", str(tmp_path)], "is a directory; name the file"),
        (["--predict", str(rte_run)], "--predict needs --input"),
        (["--input", str(rte_file)], "--input goes with --predict RUN"),
        (["--predict", str(rte_run), "--input", str(gap_file)], "header has no column 'sentence1'"),
        (["--predict", str(gap_run), "--input", str(rte_file)], "header is not the GAP header"),
        (["--predict", str(rte_run), "--input", str(rte_file), "--output", str(rte_file)], "is the input file"),
    ]
    before = {p: sorted(p.rglob("*")) for p in (rte_run, gap_run)}
    for argv, message in cases:
        _refused(capsys, argv, message)
    assert {p: sorted(p.rglob("*")) for p in (rte_run, gap_run)} == before


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_write_that_fails_after_the_checks_is_a_one_line_error(rte_run, data_dir, tmp_path, capsys, monkeypatch):
    """/proc takes no new file, not even from root, whom the check's os.access lets write anywhere (simulated here
    for every user): the write itself failed with tempfile's FileNotFoundError traceback."""
    import sparsebert.predict.finished_run as finished_run

    monkeypatch.setattr(finished_run, "unwritable_reason", lambda path: None)
    rte = tmp_path / "rte.tsv"
    rte.write_text("".join("\t".join(r[:3]) + "\n" for r in _tsv(data_dir / "glue/RTE/dev.tsv")[:5]))
    _refused(capsys, ["--predict", str(rte_run), "--input", str(rte), "--output", "/proc/sparsebert_rte.tsv"],
             "--predict: cannot write /proc/sparsebert_rte.tsv: ")


def _few_questions(data_dir: Path, to: Path) -> Path:
    """The first paragraph of the SQuAD dev file, its questions with their answers."""
    data = json.loads((data_dir / "squad/dev-v1.1.json").read_text())
    article = data["data"][0]
    to.write_text(json.dumps({"version": "1.1", "data": [{**article, "paragraphs": article["paragraphs"][:1]}]}))
    return to


@pytest.mark.parametrize("task, second_writer", [("gap", "write_gap_system_file"), ("squad", "atomic_write_json")])
def test_a_prediction_whose_second_file_fails_writes_none_of_its_files(data_dir, tmp_path, capsys, monkeypatch,
                                                                      request, task, second_writer):
    """A full disk at the second file left the first in place (a prediction without the file beside it, that a
    later run could take for a whole one); the files of an earlier prediction there were replaced by a mix."""
    import sparsebert.predict.tasks as predict

    run = request.getfixturevalue(f"{task}_run")
    capsys.readouterr()  # what training the run printed, if this test was the first to need it
    if task == "gap":
        input_file = tmp_path / "gap.tsv"
        input_file.write_text("".join("\t".join(r) + "\n" for r in _tsv(data_dir / "gap/gap-validation.tsv")[:6]))
        output = tmp_path / "fresh" / "pred.csv"
    else:
        input_file = _few_questions(data_dir, tmp_path / "squad.json")
        output = tmp_path / "fresh" / "pred.json"
    companion = output.with_name(f"pred_{'gap_system.tsv' if task == 'gap' else 'nbest_predictions.json'}")
    argv = ["--predict", str(run), "--input", str(input_file), "--output", str(output)]

    def full_disk(path, *args):
        Path(path).write_text("half")  # as a write that got partway
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(predict, second_writer, full_disk)
    _refused(capsys, argv, f"--predict: cannot write {companion}: No space left on device")
    assert list(output.parent.iterdir()) == []  # not the first file, nor a temporary
    output.write_text("old\n")  # an earlier prediction's files keep their content
    companion.write_text("old companion\n")
    _refused(capsys, argv, f"--predict: cannot write {companion}: No space left on device")
    assert output.read_text() == "old\n" and companion.read_text() == "old companion\n"
    assert sorted(output.parent.iterdir()) == sorted([output, companion])

    monkeypatch.undo()  # the disk has room again: every file is written
    _predict(capsys, run, input_file, "--output", str(output))
    assert sorted(output.parent.iterdir()) == sorted([output, companion])
    if task == "gap":
        assert output.read_text().startswith("ID,A,B,NEITHER\n") and len(output.read_text().splitlines()) == 6
        assert len(companion.read_text().splitlines()) == 5
    else:
        answers, nbest = json.loads(output.read_text()), json.loads(companion.read_text())
        assert answers and set(nbest) == set(answers)


def test_readers_take_files_without_labels(data_dir, tmp_path):
    """The readers --predict uses: GAP's 9 columns only where asked for, CSV labels mapped onto the model's."""
    rows = _tsv(data_dir / "gap/gap-validation.tsv")[:4]
    test = tmp_path / "gap_test.tsv"
    test.write_text("".join("\t".join(r[:6] + r[7:9] + r[10:]) + "\n" for r in rows))
    examples = read_gap(test, allow_unlabelled=True)
    assert len(examples) == 3 and not any(ex.labelled for ex in examples)
    assert [ex.id for ex in examples] == [r[0] for r in rows[1:]]
    with pytest.raises(SparseBertError, match="header is not the GAP header"):
        read_gap(test)  # training still needs the labels

    sst = tmp_path / "sst.tsv"
    sst.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    data = read_csv_task(sst, CsvTaskConfig(path=str(sst), text_column="sentence"), label_names=["0", "1"])
    assert data.labels == [1, 0]
    sst.write_text("sentence\tlabel\ngood\t2\n")
    with pytest.raises(SparseBertError, match="label '2' is not one the model knows"):
        read_csv_task(sst, CsvTaskConfig(path=str(sst), text_column="sentence"), label_names=["0", "1"])

    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Paris is in France.", "qas": [{"id": "q1", "question": "Where is Paris?"}]}]}]}))
    assert read_squad(squad, answers_optional=True)[0]["answers"] is None
    with pytest.raises(SparseBertError, match="'answers' is missing"):
        read_squad(squad)


@pytest.fixture(scope="module")
def rte_2to4_run(data_dir, tmp_path_factory) -> Path:
    return _finished("tiny_glue_2to4", [], "glue_rte/run0", data_dir, tmp_path_factory)


def test_sparse24_kernel_refusals_are_one_line_and_write_nothing(rte_run, rte_2to4_run, data_dir, tmp_path,
                                                                 capsys, monkeypatch):
    """--sparse24-kernel where it cannot run: without --predict, a run that is not 2:4, no CUDA device, a GPU that
    is not sm90, no kernel library. (The kernel itself runs in tests/gpu/test_predict_sparse24_gpu.py.)"""
    import torch

    from sparsebert.export.sparse24_kernel import Library

    rte_file = data_dir / "glue/RTE/dev.tsv"
    unstructured = tmp_path / "unstructured"  # a finished sparse run of another pattern (model never loaded)
    (unstructured / "model").mkdir(parents=True)
    config = json.loads((rte_2to4_run / "config.json").read_text())
    config["sparsity"]["pattern"] = "unstructured"
    (unstructured / "config.json").write_text(json.dumps(config))
    (unstructured / "model" / "model.safetensors").write_bytes(b"")
    (unstructured / "DONE").write_text("x\n")
    kernel = ["--input", str(rte_file), "--sparse24-kernel"]
    before = {p: sorted(p.rglob("*")) for p in (rte_run, rte_2to4_run, unstructured)}

    _refused(capsys, ["--sparse24-kernel"], "--sparse24-kernel goes with --predict RUN")
    _refused(capsys, ["--input", str(rte_file), "--sparse24-kernel"], "--input and --sparse24-kernel go with --predict")
    _refused(capsys, ["--predict", str(rte_run), *kernel], f"run {rte_run} is dense (no sparsity section)")
    _refused(capsys, ["--predict", str(unstructured), *kernel],
             f"run {unstructured} has sparsity.pattern 'unstructured', not \"2:4\"")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _refused(capsys, ["--predict", str(rte_2to4_run), *kernel],
             "--sparse24-kernel needs an sm90 GPU (H100/H200); this machine has no CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    _refused(capsys, ["--predict", str(rte_2to4_run), *kernel], "NVIDIA A100-SXM4-80GB is sm80")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv("SPARSEBERT_SPARSE24_LIB", str(tmp_path / "nowhere.so"))
    monkeypatch.setattr(Library, "_instance", None)
    _refused(capsys, ["--predict", str(rte_2to4_run), *kernel],
             "nowhere.so not found: build it with `python -m sparsebert.kernels.build`")
    assert {p: sorted(p.rglob("*")) for p in (rte_run, rte_2to4_run, unstructured)} == before


# ------------------------------------------------------------------- checks that need no model come before it loads


def _run_without_a_model(root: Path, task: str) -> Path:
    """A finished run as --predict checks it, whose model/ is an empty file: loading it, or the tokenizer beside
    it, would fail, so every refusal below shows it came before the model loaded."""
    run = root / "exp" / task.replace(":", "_") / "run0"
    (run / "model").mkdir(parents=True)
    (run / "model" / "model.safetensors").write_bytes(b"")
    (run / "config.json").write_text(json.dumps({"task": task, "experiment": "exp", "finetune": {}}))
    (run / "DONE").write_text("x\n")
    return run


@pytest.fixture
def no_model(monkeypatch):
    """Every loader and featurizer --predict calls fails the test if called."""
    from transformers import AutoModelForQuestionAnswering

    import sparsebert.predict.tasks as predict

    def loaded(*args, **kwargs):
        raise AssertionError("the model or the tokenizer was loaded, or the input featurized")

    for name in ("_classifier", "load_gap_model", "featurize_glue", "squad_features", "gap_features", "fold_dataset"):
        monkeypatch.setattr(predict, name, loaded)
    monkeypatch.setattr(predict.FinishedRun, "tokenizer", loaded)
    monkeypatch.setattr(AutoModelForQuestionAnswering, "from_pretrained", loaded)


def test_an_output_under_a_file_is_refused_before_the_model_loads(data_dir, tmp_path, capsys, no_model):
    run = _run_without_a_model(tmp_path, "glue:rte")
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file where a directory would be\n")
    _refused(capsys, ["--predict", str(run), "--input", str(data_dir / "glue/RTE/dev.tsv"),
                      "--output", str(blocker / "preds" / "rte.tsv")],
             f"cannot write --output {blocker / 'preds' / 'rte.tsv'}: {blocker} is a file, not a directory")
    assert blocker.read_text() == "a file where a directory would be\n"


def test_a_read_only_run_without_output_is_refused_before_the_model_loads(data_dir, tmp_path, capsys, no_model,
                                                                            monkeypatch):
    """A colleague's run: its directory is not writable, and no --output says where else to write."""
    import os

    run = _run_without_a_model(tmp_path, "glue:rte")
    run.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: the check sees the directory as any other user would
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: not (Path(p) == run and mode & os.W_OK)
                            and access(p, mode, **kw))
    try:
        _refused(capsys, ["--predict", str(run), "--input", str(data_dir / "glue/RTE/dev.tsv")],
                 f"the directory {run} is not writable; pass --output FILE in a writable directory")
        assert not (run / "predict").exists()
    finally:
        run.chmod(0o755)


def test_a_squad_question_that_is_not_text_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """Labelled (answers present): the reader used to check the question only where answers were absent, and
    pyarrow failed on it while featurizing."""
    run = _run_without_a_model(tmp_path, "squad_v1")
    squad = tmp_path / "questions.json"
    qas = [{"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]},
           {"id": "q2", "question": 42, "answers": [{"text": "Paris", "answer_start": 0}]}]
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Paris is in France.", "qas": qas}]}]}))
    _refused(capsys, ["--predict", str(run), "--input", str(squad)],
             f"{squad}: article 0, paragraph 0, question 1 (id q2): 'question' is int 42, not text")
    assert not (run / "predict").exists()


def test_an_unreadable_input_is_refused_before_the_model_loads(data_dir, tmp_path, capsys, no_model, monkeypatch):
    import os

    import sparsebert.predict.finished_run as predict

    run = _run_without_a_model(tmp_path, "glue:rte")
    rte = tmp_path / "rte.tsv"
    rte.write_bytes((data_dir / "glue/RTE/dev.tsv").read_bytes())
    rte.chmod(0)
    if os.geteuid() == 0:  # root reads anything: the file is opened as any other user would find it
        def unreadable(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(predict, "open", unreadable, raising=False)
    _refused(capsys, ["--predict", str(run), "--input", str(rte)], f"--input {rte}: cannot read it: Permission denied")


def test_an_output_among_the_runs_own_files_is_refused_before_the_model_loads(data_dir, tmp_path, capsys,
                                                                           no_model):
    """--output config.json of the run used to replace it (exit 0) and break the run: only its predict/ folder
    takes predictions, however the path is spelled (relative parts, a symlink to the run)."""
    run = _run_without_a_model(tmp_path, "glue:rte")
    (tmp_path / "link").symlink_to(run)
    rte = data_dir / "glue/RTE/dev.tsv"
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for output in (run / "config.json", run / "model" / ".." / "DONE", tmp_path / "link" / "metrics.json",
                   run / "notes" / "rte.tsv"):
        _refused(capsys, ["--predict", str(run), "--input", str(rte), "--output", str(output)],
                 f"--output {output} is inside the run directory {run}, whose files it would replace; "
                 f"write under {run / 'predict'} (the default) or outside the run")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize("task, input_file", [("glue:rte", "glue/RTE/dev.tsv"), ("gap", "gap/gap-validation.tsv")])
def test_set_values_are_validated_as_their_section_does_before_the_model_loads(data_dir, tmp_path, capsys,
                                                                               no_model, task, input_file):
    """--set train.eval_batch_size=0 used to fail in the DataLoader, and finetune.max_seq_length beyond the model's
    position embeddings in its forward pass, both with a traceback after featurizing. (A GAP run's model/ has no
    config: its positions are those of the encoder it started from.)"""
    run = _run_without_a_model(tmp_path, task)
    model_config = run / "model" if task != "gap" else tmp_path / "encoder"
    model_config.mkdir(exist_ok=True)
    (model_config / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "model_source": str(tmp_path / "encoder")}))
    given = ["--predict", str(run), "--input", str(data_dir / input_file)]
    for size in ("0", "-4"):
        _refused(capsys, [*given, "--set", f"train.eval_batch_size={size}"],
                 f"train.eval_batch_size must be >= 1, got {size}")
    _refused(capsys, [*given, "--set", "finetune.max_seq_length=8"], "finetune.max_seq_length must be in [16, 4096]")
    _refused(capsys, [*given, "--set", "finetune.max_seq_length=1024"],
             f"finetune.max_seq_length=1024 is beyond the 512 position embeddings of {model_config}")
    with pytest.raises(AssertionError, match="was loaded"):  # a length the model has passes every check
        cli_main([*given, "--set", "finetune.max_seq_length=512", "--set", "train.eval_batch_size=4"])
    assert not (run / "predict").exists()


@pytest.mark.parametrize("task, companion", [("squad_v1", "nbest_predictions.json"),
                                             ("squad_v2", "null_odds.json"), ("gap", "gap_system.tsv")])
def test_every_file_a_prediction_writes_is_checked_before_the_model_loads(data_dir, tmp_path, capsys, no_model,
                                                                          task, companion):
    """A directory where a file beside --output goes was found only after the predictions file was written, with a
    traceback; an input file that one of them would replace was not found at all."""
    run = _run_without_a_model(tmp_path, task)
    given = tmp_path / f"in_{companion}"  # the task's file, named as the companion of an output in.*
    given.write_bytes((data_dir / ("gap/gap-validation.tsv" if task == "gap" else "squad/dev-v1.1.json")).read_bytes())
    output, blocker = tmp_path / "out" / "pred.out", tmp_path / "out" / f"pred_{companion}"
    blocker.mkdir(parents=True)
    _refused(capsys, ["--predict", str(run), "--input", str(given), "--output", str(output)],
             f"{blocker} (written beside --output {output}) is a directory; name another --output")
    _refused(capsys, ["--predict", str(run), "--input", str(given), "--output", str(tmp_path / "in.out")],
             f"{given} (written beside --output {tmp_path / 'in.out'}) is the input file; name another --output")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [blocker.name]
    assert not (tmp_path / "in.out").exists() and not (run / "predict").exists()


def test_set_changes_how_the_input_is_read(csv_run, data_dir, tmp_path, capsys):
    """--set csv.text_column=... reads a file whose text column the run did not train with; keys that are how the
    run trained are refused in one line."""
    rows = _tsv(data_dir / "glue/SST-2/dev.tsv")[1:9]
    renamed, plain = tmp_path / "renamed.tsv", tmp_path / "plain.tsv"
    renamed.write_text("review\n" + "".join(f"{s}\n" for s, _ in rows))
    plain.write_text("sentence\n" + "".join(f"{s}\n" for s, _ in rows))
    _refused(capsys, ["--predict", str(csv_run), "--input", str(renamed)], "'sentence'")
    _predict(capsys, csv_run, renamed, "--set", "csv.text_column=review")
    _predict(capsys, csv_run, plain)
    predict_dir = csv_run / "predict"
    assert (predict_dir / "renamed.csv").read_text() == (predict_dir / "plain.csv").read_text()
    _refused(capsys, ["--predict", str(csv_run), "--input", str(plain), "--set", "train.learning_rate=0.1"],
             "--set train.learning_rate: --predict takes only csv.*")


def _far_apart(row: list[str], filler_words: int) -> list[str]:
    """A GAP row (11 fields) with filler text inserted after its first mention: the others move that far away."""
    offsets = {3: int(row[3]), 5: int(row[5]), 8: int(row[8])}
    names = {3: row[2], 5: row[4], 8: row[7]}
    first = min(offsets, key=offsets.get)
    at = offsets[first] + len(names[first])
    filler = " and so on" * filler_words
    row = list(row)
    row[1] = row[1][:at] + filler + row[1][at:]
    for col, off in offsets.items():
        row[col] = str(off + len(filler) if off >= at else off)
    return row


def test_gap_rows_with_mentions_too_far_apart(gap_run, data_dir, tmp_path, capsys):
    """A Kaggle file needs every ID: a row whose mentions do not fit the run's 128 tokens is truncated around them
    by default; --long-rows skip leaves it out, --long-rows error refuses the file in one line."""
    rows = _tsv(data_dir / "gap/gap-validation.tsv")[:4]
    rows[2] = _far_apart(rows[2], 150)
    test = tmp_path / "gap_test.tsv"
    test.write_text("".join("\t".join(r[:6] + r[7:9] + r[10:]) + "\n" for r in rows))
    ids = [r[0] for r in rows[1:]]

    _predict(capsys, gap_run, test, "--output", str(tmp_path / "all.csv"))
    submission = (tmp_path / "all.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in submission[1:]] == ids
    _predict(capsys, gap_run, test, "--output", str(tmp_path / "skip.csv"), "--long-rows", "skip")
    assert (tmp_path / "skip.csv").read_text().splitlines() == [submission[0], submission[1], submission[3]]
    _refused(capsys, ["--predict", str(gap_run), "--input", str(test), "--long-rows", "error"],
             f"row {ids[1]} (1 row(s) in all)")


def test_every_task_with_a_predictor_has_an_output_format():
    from sparsebert.predict.finished_run import COMPANIONS, EXTENSIONS, INPUT_FORMATS
    from sparsebert.predict.tasks import PREDICTORS

    assert PREDICTORS.keys() == EXTENSIONS.keys() == COMPANIONS.keys() == INPUT_FORMATS.keys()


def test_another_tasks_file_is_named_as_such_before_the_model_loads(data_dir, tmp_path, capsys, no_model):
    """A SQuAD JSON given to an RTE run used to fail as a CSV 'field larger than field limit'."""
    squad, rte = data_dir / "squad/dev-v1.1.json", data_dir / "glue/RTE/dev.tsv"
    rte_run, squad_run = _run_without_a_model(tmp_path, "glue:rte"), _run_without_a_model(tmp_path, "squad_v1")
    _refused(capsys, ["--predict", str(rte_run), "--input", str(squad)],
             f"--input {squad}: a JSON file; run {rte_run} (task glue:rte) predicts on a GLUE TSV in the task's layout")
    _refused(capsys, ["--predict", str(squad_run), "--input", str(rte)],
             f"--input {rte}: not JSON; run {squad_run} (task squad_v1) predicts on a SQuAD JSON")
    assert not (rte_run / "predict").exists() and not (squad_run / "predict").exists()


@pytest.mark.parametrize("kind, content", [
    ("csv", b"[Verse 1] a song,1\n{braces} in text,0\n"),  # a row may start with a bracket
    ("csv", b"[" * 100_000 + b",1\n"),  # deeper than json nests: not JSON, and no traceback
    ("squad_v1", b""),  # the reader says it is empty
    ("squad_v1", '{"data": []}'.encode("utf-16")),  # the reader says it is not UTF-8
    ("squad_v1", b"\xef\xbb\xbf" + b" " * 5000 + b'{"data": []}'),  # a BOM, then more than a block of spaces
])
def test_what_the_format_check_cannot_tell_is_left_to_the_reader(tmp_path, kind, content):
    from sparsebert.predict.finished_run import FinishedRun, check_input_format

    path = tmp_path / "input"
    path.write_bytes(content)
    check_input_format(FinishedRun(tmp_path, {"task": kind}, kind, None), path)  # no error
