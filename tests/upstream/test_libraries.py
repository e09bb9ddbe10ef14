"""Every private attribute of a Transformers config, tokenizers, datasets and optuna that sparsebert touches
(upstream/libraries.py) still exists and means what sparsebert takes it to mean: an upgrade that renames one
fails here, by name."""

from __future__ import annotations

import datasets
import optuna
from tokenizers import BertWordPieceTokenizer, Tokenizer
from transformers import BertConfig

from sparsebert.upstream import libraries

SEE = "see sparsebert/upstream/libraries.py"


def test_every_listed_name_has_a_test_here():
    names = {name for names in libraries.PRIVATE_NAMES.values() for name in names}
    assert names == {"_attn_implementation", "_tokenizer", "_indices", "_fingerprint", "_trial_id"}


def test_a_configs_attention_implementation():
    config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
    assert hasattr(config, "_attn_implementation"), f"PretrainedConfig._attn_implementation is gone: {SEE}"
    libraries.set_attn_implementation(config, "eager")
    assert config._attn_implementation == "eager"


def test_the_tokenizer_inside_a_tokenizers_implementation():
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(["a tiny corpus", "of two lines"], vocab_size=60, min_frequency=1,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    assert hasattr(trainer, "_tokenizer"), f"BaseTokenizer._tokenizer is gone: {SEE}"
    inner = libraries.tokenizer_object(trainer)
    assert isinstance(inner, Tokenizer)
    assert inner.get_vocab() == trainer.get_vocab()


def test_a_datasets_row_mapping_and_fingerprint():
    table = datasets.Dataset.from_dict({"x": [10, 11, 12, 13]})
    assert libraries.row_indices(table) is None  # no mapping on a fresh dataset
    picked = table.select([3, 1])
    assert hasattr(picked, "_indices") and hasattr(picked, "_fingerprint"), f"Dataset private names: {SEE}"
    assert libraries.row_indices(picked).column(0).to_pylist() == [3, 1]  # row numbers into the table
    assert isinstance(libraries.fingerprint(picked), str)
    assert libraries.fingerprint(picked) != libraries.fingerprint(table)
    assert libraries.fingerprint(table.select([3, 1])) == libraries.fingerprint(picked)  # deterministic


def test_a_frozen_trials_storage_id():
    study = optuna.create_study()
    trial = study.ask()
    frozen = study.trials[0]
    assert hasattr(frozen, "_trial_id"), f"FrozenTrial._trial_id is gone: {SEE}"
    assert libraries.trial_id(frozen) == trial._trial_id
    assert optuna.Trial(study, libraries.trial_id(frozen)).number == frozen.number  # how a trial is taken up
