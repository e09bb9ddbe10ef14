"""--resume picks the newest checkpoint that a crash or a bad disk left whole, a mask file that does not fit is bad
input, and loading a checkpoint does not report tied weights as missing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForMaskedLM, TrainingArguments

from sparsebert.errors import SparseBertError
from sparsebert.jobs.pretrain import last_complete_checkpoint, load_masks
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.sparsity import SparsityConfig, SparsityController
from sparsebert.sparsity.persistence import MASKS_FILE, STATE_FILE
from sparsebert.trainer.trainer import SparseBertTrainer


def write_whole(path: Path) -> None:
    """A small file of the kind its name says, that reads back whole."""
    if path.suffix == ".safetensors":
        save_file({"weight": torch.arange(64, dtype=torch.float32)}, path)
    elif path.suffix == ".pt":
        torch.save({"exp_avg": torch.arange(1024, dtype=torch.float32)}, path)
    else:
        path.write_text(json.dumps({"global_step": 1}))


def checkpoint(run_dir: Path, step: int, *files: str) -> Path:
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name in files:
        write_whole(path / name)
    return path


def test_dense_run_resumes_from_the_newest_checkpoint_with_a_trainer_state(tmp_path, caplog):
    checkpoint(tmp_path, 9, "trainer_state.json")
    ten = checkpoint(tmp_path, 10, "trainer_state.json")
    checkpoint(tmp_path, 20, "model.safetensors")  # crashed before the Trainer wrote its state
    (tmp_path / "checkpoint-30.tmp").mkdir()  # not a checkpoint name
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(tmp_path, sparse=False) == ten
    assert "checkpoint-20" in caplog.text and "trainer_state.json" in caplog.text


def test_sparse_run_needs_the_masks_too(tmp_path, caplog):
    ten = checkpoint(tmp_path, 10, "trainer_state.json", MASKS_FILE, STATE_FILE)
    checkpoint(tmp_path, 20, "trainer_state.json")  # crashed after the Trainer's save, before on_save's masks
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(tmp_path, sparse=True) == ten
    assert MASKS_FILE in caplog.text and STATE_FILE in caplog.text
    assert last_complete_checkpoint(tmp_path, sparse=False) == tmp_path / "checkpoint-20"


def test_no_complete_checkpoint_starts_over(tmp_path):
    checkpoint(tmp_path, 10, "trainer_state.json")
    assert last_complete_checkpoint(tmp_path, sparse=True) is None
    assert last_complete_checkpoint(tmp_path / "empty", sparse=True) is None


WHOLE = ("model.safetensors", "optimizer.pt", "trainer_state.json")


def garbage_header(path: Path) -> None:
    path.write_bytes(b"\xff" * 8 + path.read_bytes()[8:])


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def flipped_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, damage", [("model.safetensors", garbage_header), ("model.safetensors", cut_short),
                                          ("optimizer.pt", flipped_byte), ("trainer_state.json", cut_short)])
def test_a_damaged_last_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, name, damage):
    ten = checkpoint(tmp_path, 10, *WHOLE)
    twenty = checkpoint(tmp_path, 20, *WHOLE)
    damage(twenty / name)
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(tmp_path, sparse=False) == ten
    assert str(twenty / name) in caplog.text


def test_a_damaged_only_checkpoint_is_an_error_naming_the_file(tmp_path):
    twenty = checkpoint(tmp_path, 20, *WHOLE)
    garbage_header(twenty / "model.safetensors")
    with pytest.raises(SparseBertError, match=f"{twenty / 'model.safetensors'} is cut short"):
        last_complete_checkpoint(tmp_path, sparse=False)


def test_loading_a_checkpoint_does_not_call_tied_weights_missing(tmp_path, monkeypatch, caplog):
    """The saved checkpoint holds the word embeddings once; the decoder's weight and bias are tied to loaded
    tensors, not missing."""
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    saved = SparseBertTrainer(model=BertForMaskedLMAtMasked(config), args=args)
    saved.save_model(str(tmp_path / "checkpoint-1"))
    model = BertForMaskedLMAtMasked(config)
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)  # transformers logs to its own handler
    with caplog.at_level(logging.WARNING):
        SparseBertTrainer(model=model, args=args)._load_from_checkpoint(str(tmp_path / "checkpoint-1"))
    assert "missing keys" not in caplog.text
    assert torch.equal(model.cls.predictions.decoder.weight, saved.model.bert.embeddings.word_embeddings.weight)


@pytest.fixture
def controller() -> SparsityController:
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    return SparsityController(BertForMaskedLM(config), SparsityConfig(sparsity=0.5))


def test_masks_that_do_not_load_are_a_one_line_error(controller, tmp_path):
    controller.save(tmp_path)
    load_masks(controller, tmp_path)  # what was saved loads
    state = json.loads((tmp_path / STATE_FILE).read_text())
    (tmp_path / STATE_FILE).write_text(json.dumps({**state, "format_version": 99}))
    with pytest.raises(SparseBertError, match="cannot load the sparsity masks of .*format_version"):
        load_masks(controller, tmp_path)
    controller.save(tmp_path)
    (tmp_path / MASKS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(SparseBertError, match="cannot load the sparsity masks"):
        load_masks(controller, tmp_path)
    (tmp_path / MASKS_FILE).unlink()
    with pytest.raises(SparseBertError, match=MASKS_FILE):
        load_masks(controller, tmp_path)
