"""--train-tokenizer: a WordPiece vocab trained on real Wikipedia text, usable as model.tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.runner import RunOptions, run_experiment


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "wordpiece"
    code = cli_main(["--train-tokenizer", str(out), "--data-dir", str(data_dir), "--max-files", "1",
                     "--vocab-size", "2000"])
    assert code == 0
    return out


def test_trained_vocab_is_a_bert_wordpiece_tokenizer(trained):
    tok = load_tokenizer(str(trained))
    assert tok.is_fast and len(tok) == 2000
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    ids = tok("Anarchism is a political philosophy")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids  # words of the training text are in its vocab
    assert tok.tokenize("ANARCHISM") == ["anarchism"]  # uncased


def test_pretraining_runs_with_the_trained_vocab(trained, data_dir, tmp_path):
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [
        f"model.tokenizer={trained}", "data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16",
        "data.max_seq_length=64", "train.global_batch_size=8", "train.max_steps=4", "train.eval_steps=4",
        "train.save_steps=4", "train.report_to=[]"])
    metrics = run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))
    assert metrics["global_step"] == 4
    assert metrics["initial_eval_loss"] == pytest.approx(7.6, abs=0.5)  # about ln(2000): the vocab is 2000
