"""--resume picks the newest checkpoint that a crash left whole, and a mask file that does not fit is bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from transformers import BertConfig, BertForMaskedLM

from sparsebert.errors import SparseBertError
from sparsebert.sparsity import SparsityConfig, SparsityController
from sparsebert.sparsity.persistence import MASKS_FILE, STATE_FILE
from sparsebert.trainer.pretrain import last_complete_checkpoint, load_masks


def checkpoint(run_dir: Path, step: int, *files: str) -> Path:
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("{}")
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
