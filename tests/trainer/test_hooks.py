"""build_hooks: sparsity settings that do not fit the model or the run length are a SparseBertError (one line)."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertForMaskedLM

from sparsebert.config import ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.trainer.hooks import build_hooks


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


@pytest.fixture
def model() -> BertForMaskedLM:
    return BertForMaskedLM(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32))


def test_include_matching_no_weight(registry, model):
    cfg = registry.build("sparse_tiny_rigl", ["sparsity.include=nomatch"])
    with pytest.raises(SparseBertError, match="sparsity.include/exclude select no weight"):
        build_hooks(cfg, model, cfg.train.max_steps, cfg.seed)


def test_rigl_range_beyond_a_run_counted_in_epochs(registry, model):
    # with train.epochs the steps are known only from the data: 40 here, so RigL would end at 30 < begin 35
    cfg = registry.build("sparse_tiny_rigl", ["rigl.begin_step=35", "task=glue", "model.init_from=minilm",
                                              "train.epochs=1"])
    with pytest.raises(SparseBertError, match=r"rigl.end_step \(resolved to 30\) must be > rigl.begin_step \(35\)"):
        build_hooks(cfg, model, 40, cfg.seed)
    assert build_hooks(cfg, model, 100, cfg.seed)["sparsity"].rigl_end_step == 75
