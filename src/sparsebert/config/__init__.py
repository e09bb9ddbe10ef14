"""Experiment configuration: typed sections, the experiment registry and ``--set`` overrides."""

from sparsebert.config.experiment import DEFAULT_SEED, PRETRAINING_TASKS, ExperimentConfig
from sparsebert.config.experiment_registry import ExperimentRegistry, deep_update
from sparsebert.config.schema import ConfigError, from_dict, to_dict
from sparsebert.config.sections import MODEL_SIZES, DataConfig, ModelConfig, TrainConfig

__all__ = [
    "DEFAULT_SEED", "MODEL_SIZES", "PRETRAINING_TASKS", "ConfigError", "DataConfig", "ExperimentConfig", "ModelConfig", "ExperimentRegistry",
    "TrainConfig", "deep_update", "from_dict", "to_dict",
]
