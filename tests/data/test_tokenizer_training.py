"""--train-tokenizer: a WordPiece vocab trained on real Wikipedia text, usable as model.tokenizer."""

from __future__ import annotations

import json
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


def _train(out: Path, corpus: Path, *extra: str) -> int:
    return cli_main(["--train-tokenizer", str(out), "--corpus", str(corpus), "--corpus-format", "text",
                     "--vocab-size", "100", *extra])


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus" / "a.txt"
    path.parent.mkdir()
    path.write_text("the cat sat on the mat\nthe dog sat on the log\n\nanother document about cats\n")
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_a_taken_out_dir_is_refused_before_training_and_left_as_it_was(corpus, tmp_path, capsys):
    model = tmp_path / "exported_model"  # a model directory: its tokenizer must not be replaced
    model.mkdir()
    (model / "tokenizer.json").write_text('{"mine": true}')
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for out in (model, a_file):
        assert _train(out, corpus) == 2
        assert f"--train-tokenizer {out} exists and is not an empty directory" in _one_error_line(capsys)
    assert json.loads((model / "tokenizer.json").read_text()) == {"mine": True} and a_file.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "exported_model", "notes.txt"]


@pytest.mark.parametrize("extra,words", [(["--vocab-size", "-5"], "--vocab-size -5: need at least 5"),
                                         (["--vocab-size", "4"], "--vocab-size 4: need at least 5"),
                                         (["--max-files", "0"], "--max-files 0: read at least 1 corpus file")])
def test_bad_sizes_are_one_line_errors(corpus, tmp_path, capsys, extra, words):
    assert _train(tmp_path / "tok", corpus, *extra) == 2
    assert words in _one_error_line(capsys)
    assert not (tmp_path / "tok").exists()


def test_vocab_size_and_corpus_format_given_or_left_at_their_defaults(tmp_path, capsys):
    """--vocab-size is honoured, left out it is 30522 (more than this corpus yields), and --corpus-format left out is
    wikiextractor: the flags default to None in argparse, so the defaults are applied where they are read."""
    import itertools

    words = ["".join(chars) for chars in itertools.product("abcdefghij", "klmnopqrst", "uvwxyz")]  # 600 words
    corpus = tmp_path / "corpus" / "a.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(" ".join(words[i:i + 10]) for i in range(0, len(words), 10)) * 2 + "\n")
    assert _train(tmp_path / "tok80", corpus, "--vocab-size", "80") == 0
    assert len(load_tokenizer(str(tmp_path / "tok80"))) == 80
    assert cli_main(["--train-tokenizer", str(tmp_path / "tok"), "--corpus", str(corpus), "--corpus-format",
                     "text"]) == 0
    assert len(load_tokenizer(str(tmp_path / "tok"))) > 80  # not capped: every merge the corpus has
    capsys.readouterr()
    assert cli_main(["--train-tokenizer", str(tmp_path / "wiki"), "--corpus", str(corpus)]) == 2
    assert "a.txt:1: text outside a <doc> element" in _one_error_line(capsys)  # read as WikiExtractor files


def test_the_tokenizer_appears_whole_or_not_at_all(corpus, tmp_path, capsys):
    empty = tmp_path / "empty"  # an empty directory is fine: it is replaced by the trained tokenizer
    empty.mkdir()
    assert _train(empty, corpus) == 0
    assert load_tokenizer(str(empty)).tokenize("cats") and (empty / "tokenizer.json").is_file()
    corpus.with_name("b.txt").write_bytes(b"\xff\xfe not utf-8\n")  # read after a.txt: training fails midway
    out = tmp_path / "new" / "tok"
    assert _train(out, corpus.parent) == 2
    assert "b.txt is not UTF-8 text" in _one_error_line(capsys)
    assert list((tmp_path / "new").iterdir()) == []  # neither the tokenizer nor a temporary directory
