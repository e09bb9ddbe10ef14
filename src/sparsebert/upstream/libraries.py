"""The private attributes sparsebert reads or sets on objects of Transformers (a model config), tokenizers,
datasets and optuna. Plain attribute access: this module imports none of those libraries, so the modules that
load them lazily (data/featurize.py, the search's parent process) stay lazy.

- ``PretrainedConfig._attn_implementation``: the attention a model built from a config runs (what
  ``from_pretrained(attn_implementation=...)`` sets).
- ``BaseTokenizer._tokenizer`` (tokenizers' implementations, e.g. BertWordPieceTokenizer): the trained
  ``tokenizers.Tokenizer`` inside, which BertTokenizerFast takes as ``tokenizer_object``.
- ``Dataset._indices``: the row mapping that select / shuffle / train_test_split leave on a Dataset (None when
  there is none), to weigh the rows of its underlying table.
- ``Dataset._fingerprint``: the cache fingerprint datasets gives every transform's result (names its cached files).
- ``FrozenTrial._trial_id``: the storage id of a trial, to take up a RUNNING trial again.

``PRIVATE_NAMES`` lists them for tests/upstream/test_libraries.py.
"""

from __future__ import annotations

from typing import Any

PRIVATE_NAMES = {
    "transformers.PretrainedConfig": ["_attn_implementation"],
    "tokenizers.implementations.BaseTokenizer": ["_tokenizer"],
    "datasets.Dataset": ["_indices", "_fingerprint"],
    "optuna.trial.FrozenTrial": ["_trial_id"],
}


def set_attn_implementation(config, attn_implementation: str) -> None:
    """Which attention a model built from ``config`` runs; the config has no public setter for it."""
    config._attn_implementation = attn_implementation


def attn_implementation(config) -> str:
    """Which attention a model built from ``config`` runs (what ``set_attn_implementation`` sets)."""
    return config._attn_implementation


def tokenizer_object(implementation) -> Any:
    """The ``tokenizers.Tokenizer`` a tokenizers implementation (BertWordPieceTokenizer, ...) wraps and trains."""
    return implementation._tokenizer


def row_indices(dataset) -> Any:
    """The pyarrow table of row numbers that maps a Dataset's rows to its underlying table, or None (datasets
    has no public accessor; ``flatten_indices`` would copy the table)."""
    return dataset._indices


def fingerprint(dataset) -> str:
    """The datasets cache fingerprint of ``dataset``: it names the cached files and every step applied to them."""
    return dataset._fingerprint


def trial_id(frozen) -> int:
    """A trial's storage id: optuna has no public call to take up a RUNNING trial again, and ``Study.ask`` wraps
    a trial id just like ``optuna.Trial(study, trial_id(frozen))``."""
    return frozen._trial_id
