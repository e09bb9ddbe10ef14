"""The model card of an export says what the run is: dense or sparse, its metrics with every integer digit, and the
command and commit of the invocation that trained it, also after a ``--resume`` at another commit."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from sparsebert.config import ExperimentRegistry
from sparsebert.export.model_card import model_card
from sparsebert.results import RunRecord, RunRegistry
from sparsebert.results.recording import run_key
from sparsebert.runner import RunOptions, run_experiment

ARCH = "BertForSequenceClassification"


def write_run(run_dir: Path, config: dict, metrics: dict, env: dict | None = None) -> Path:
    """A finished run's files as a card reads them (no model: the card does not read it)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if env is not None:
        (run_dir / "env.json").write_text(json.dumps(env))
    return run_dir


def card_parts(text: str) -> tuple[dict, str]:
    """The card's front matter, parsed, and its body."""
    front, body = text.split("---\n")[1], text.split("---\n", 2)[2]
    return {k: json.loads(v) for k, v in (line.split(": ", 1) for line in front.strip().splitlines())}, body


def rows(body: str, metrics: bool = False) -> dict[str, str]:
    """The rows of the card's table of facts (``metrics``: of its metrics table), by their first cell."""
    facts, _, rest = body.partition("## Metrics")
    cells = [line.strip("|").split(" | ") for line in (rest if metrics else facts).splitlines() if line.startswith("| ")]
    return {c[0].strip(): c[1].strip() for c in cells if len(c) == 2}


def test_a_dense_run_is_called_dense(tmp_path):
    """A dense baseline (no sparsity section, no sparsity.json) was called "A sparse ..." and tagged sparse."""
    run = write_run(tmp_path / "dense_exp" / "glue_sst2" / "run0",
                    {"task": "glue:sst2", "experiment": "dense_exp", "seed": 42, "model": {"init_from": "minilm"},
                     "sparsity": None}, {"accuracy": 0.9})
    meta, body = card_parts(model_card(run, ["negative", "positive"], ARCH, ""))
    assert meta["tags"] == ["sparsebert", "glue-sst2"]
    assert f"A dense {ARCH} (no weights pruned) trained by sparsebert." in body
    assert rows(body)["sparsity"] == "dense (no weights pruned)"
    assert "sparse " not in body.replace("sparsebert", "") and "pruned weights" not in body


def test_a_sparse_run_without_a_report_is_sparse_by_its_settings(tmp_path):
    run = write_run(tmp_path / "exp", {"task": "mlm", "sparsity": {"sparsity": 0.9}}, {"eval_loss": 2.0})
    meta, body = card_parts(model_card(run, None, "BertForMaskedLM", ""))
    assert meta["tags"] == ["sparsebert", "sparse", "pruned", "mlm"]
    assert "A sparse BertForMaskedLM trained by sparsebert." in body and rows(body)["sparsity"] == "sparse (not measured)"
    (run / "metrics.json").write_text(json.dumps({"sparsity": 0.9}))
    meta, body = card_parts(model_card(run, None, "BertForMaskedLM", ""))
    assert "sparsity-90" in meta["tags"]
    assert rows(body)["sparsity"] == "90.0 % of the pruned layers' weights are zero (metrics.json)"


def test_metrics_keep_every_integer_digit(tmp_path):
    """Counts were printed with 4 significant digits: global_step 123456 as 1.235e+05."""
    metrics = {"global_step": 123456, "train_blocks": 100000.0, "perplexity": 31410.54, "eval_loss": 2.3456789,
               "learning_rate": 1.5e-05, "accuracy": 0.8125, "mean_steps": 1234.5678, "diverged": math.nan}
    run = write_run(tmp_path / "exp", {"task": "mlm"}, metrics)
    _, body = card_parts(model_card(run, None, "BertForMaskedLM", ""))
    assert {k: rows(body, metrics=True)[k] for k in metrics} == {
        "global_step": "123456", "train_blocks": "100000", "perplexity": "31410.5", "eval_loss": "2.346",
        "learning_rate": "1.5e-05", "accuracy": "0.8125", "mean_steps": "1235", "diverged": "nan"}


def test_a_resumed_run_names_the_invocation_that_finished_it_and_the_one_that_started_it(tmp_path):
    start = {"git_commit": "aaaaaaa", "argv": ["run.py", "exp"]}
    resume = {"git_commit": "bbbbbbb", "argv": ["run.py", "exp", "--resume"], "resumed_at": "2026-01-02"}
    run = write_run(tmp_path / "exp", {"task": "mlm"}, {}, {**start, "resumes": [resume]})
    table = rows(card_parts(model_card(run, None, "BertForMaskedLM", ""))[1])
    assert (table["command"], table["commit"]) == ("`sparsebert exp --resume`", "bbbbbbb")
    assert table["started by"] == "`sparsebert exp` at commit aaaaaaa"
    assert table["resumes"] == "1 (the last one: the command and commit above)"


def test_a_finetuning_run_without_its_own_env_takes_its_commit_from_the_registry(tmp_path):
    """A finetuning run made before runs wrote their own env.json: its experiment's env.json names the latest
    invocation. Where the registry recorded another commit for the run, that one is the run's, and no command is on
    record for it."""
    experiment = tmp_path / "exp"
    run = write_run(experiment / "glue_rte" / "run0", {"task": "glue:rte"}, {})
    (experiment / "env.json").write_text(json.dumps({"git_commit": "bbbbbbb", "argv": ["run.py", "exp", "--resume"]}))
    registry = RunRegistry.in_output_root(tmp_path)
    registry.record(RunRecord(run_dir=run_key(run), experiment="exp", task="glue:rte", model="minilm", seed=42,
                              status="done", git_commit="aaaaaaa"))
    table = rows(card_parts(model_card(run, None, ARCH, ""))[1])
    assert (table["command"], table["commit"]) == ("`-`", "aaaaaaa") and "started by" not in table
    registry.record(RunRecord(run_dir=run_key(run), experiment="exp", task="glue:rte", model="minilm", seed=42,
                              status="done", git_commit="bbbbbbb"))
    table = rows(card_parts(model_card(run, None, ARCH, ""))[1])
    assert (table["command"], table["commit"]) == ("`sparsebert exp --resume`", "bbbbbbb")


@pytest.mark.slow
def test_after_a_resume_at_another_commit_each_finetuning_run_names_its_own(tmp_path, data_dir, monkeypatch):
    """The reviewer's case: tiny_glue at commit aaaaaaa, one run and the experiment's DONE deleted, --resume at
    bbbbbbb. The run that stayed finished was trained at aaaaaaa by the first command, as the registry says; the
    card named the resume's."""
    overrides = ["finetune.glue_tasks=rte", "finetune.runs_per_task={}", "finetune.num_runs=2",
                 "finetune.max_seq_length=64", "finetune.max_train_samples=8", "finetune.max_eval_samples=8",
                 "train.global_batch_size=8", "train.report_to=[]", "finetune.save_model=false"]
    cfg = ExperimentRegistry.builtin().build("tiny_glue", overrides)
    for commit, flags in (("aaaaaaa", []), ("bbbbbbb", ["--resume"])):
        monkeypatch.setenv("SPARSEBERT_COMMIT", commit)
        monkeypatch.setattr(sys, "argv", ["run.py", "tiny_glue", *flags])
        run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir, resume=bool(flags)))
        if not flags:
            (tmp_path / "tiny_glue" / "DONE").unlink()
            (tmp_path / "tiny_glue" / "glue_rte" / "run1" / "DONE").unlink()
    registry = RunRegistry.in_output_root(tmp_path)
    for k, command, commit in ((0, "sparsebert tiny_glue", "aaaaaaa"), (1, "sparsebert tiny_glue --resume", "bbbbbbb")):
        run = tmp_path / "tiny_glue" / "glue_rte" / f"run{k}"
        assert registry.get(run_key(run)).git_commit == commit
        table = rows(card_parts(model_card(run, None, ARCH, ""))[1])
        assert (table["command"], table["commit"]) == (f"`{command}`", commit) and "started by" not in table
    env = json.loads((tmp_path / "tiny_glue" / "env.json").read_text())  # the experiment's: started, then resumed
    assert [e["git_commit"] for e in (env, *env["resumes"])] == ["aaaaaaa", "bbbbbbb"]


def test_an_older_finetuning_run_of_a_resumed_experiment_names_the_invocation_at_its_commit(tmp_path):
    """A finetuning run without its own env.json, in an experiment whose env.json records its start and a resume:
    the invocation at the registry's commit for the run trained it, and a finetuning run is never resumed."""
    experiment = tmp_path / "exp"
    run = write_run(experiment / "glue_rte" / "run0", {"task": "glue:rte"}, {})
    (experiment / "env.json").write_text(json.dumps({"git_commit": "aaaaaaa", "argv": ["run.py", "exp"], "resumes": [
        {"git_commit": "bbbbbbb", "argv": ["run.py", "exp", "--resume"]}]}))
    table = rows(card_parts(model_card(run, None, ARCH, ""))[1])  # no registry: the latest invocation, alone
    assert (table["command"], table["commit"]) == ("`sparsebert exp --resume`", "bbbbbbb") and "resumes" not in table
    RunRegistry.in_output_root(tmp_path).record(RunRecord(
        run_dir=run_key(run), experiment="exp", task="glue:rte", model="minilm", seed=42, status="done",
        git_commit="aaaaaaa"))
    table = rows(card_parts(model_card(run, None, ARCH, ""))[1])
    assert (table["command"], table["commit"]) == ("`sparsebert exp`", "aaaaaaa") and "started by" not in table
