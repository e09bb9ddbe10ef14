"""The fully resolved experiment: all sections, typed and validated together."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparsebert.config.schema import ConfigError
from sparsebert.config.sections import DataConfig, ModelConfig, TrainConfig

TASKS = ("mlm",)
DEFAULT_SEED = 42


@dataclass
class ExperimentConfig:
    name: str
    description: str = ""
    task: str = "mlm"
    seed: int = DEFAULT_SEED
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.data.max_seq_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"data.max_seq_length={self.data.max_seq_length} is beyond the model's "
                f"model.max_position_embeddings={self.model.max_position_embeddings}")
