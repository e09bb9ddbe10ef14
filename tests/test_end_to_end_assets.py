"""End to end on a fresh clone: tiny pretraining and GLUE finetuning on the checked-in assets (``tests/assets``).

The same experiments on the real data, with many more checks, are in tests/jobs/test_pretrain.py and test_finetune.py; these
two runs are what is left of them without the real data: the registry, runner, data pipeline, Trainer and result
files on real text.
"""

from __future__ import annotations

import math

import pytest
from tiny_glue_checks import check_tiny_glue_outputs

from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.runner import RunOptions, run_experiment

pytestmark = pytest.mark.slow

# bert_tiny_quick cut to a few seconds: 4 of the 12 asset articles held out for evaluation, 64-token blocks,
# 20 steps of 8 blocks (a few passes over the other 8 articles)
FAST = [
    "data.eval_documents=4", "data.max_eval_samples=32", "data.max_seq_length=64",
    "train.global_batch_size=8", "train.max_steps=20", "train.eval_steps=10", "train.save_steps=10",
    "train.logging_steps=2", "train.report_to=[]", "train.warmup_steps=0",
]


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def test_tiny_pretraining_on_the_asset_corpus(registry, asset_data_dir, tmp_path):
    metrics = run_experiment(registry.build("bert_tiny_quick", FAST),
                             RunOptions(output_root=tmp_path, data_dir=asset_data_dir))
    run_dir = tmp_path / "bert_tiny_quick"
    for name in ("config.json", "env.json", "metrics.json", "DONE", "model/model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert metrics["global_step"] == 20
    assert metrics["eval_loss"] < metrics["initial_eval_loss"] - 0.5  # it learned something
    assert math.isclose(metrics["perplexity"], math.exp(metrics["eval_loss"]))


def test_tiny_glue_on_the_asset_rte_and_stsb(registry, asset_data_dir, tmp_path, capsys):
    # as shipped: the 20 training rows of each slice are fewer than its 128, so 2 optimizer steps per run
    run_experiment(registry.build("tiny_glue"), RunOptions(output_root=tmp_path, data_dir=asset_data_dir))
    root = tmp_path / "tiny_glue"
    check_tiny_glue_outputs(root, eval_rows=20, data_dir=asset_data_dir)  # the whole dev slice
    assert (root / "DONE").is_file()
    capsys.readouterr()
    assert cli_main(["--table", "glue", "--output-dir", str(tmp_path)]) == 0
    assert "| tiny_glue" in capsys.readouterr().out
