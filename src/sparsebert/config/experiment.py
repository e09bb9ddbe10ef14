"""The fully resolved experiment: all sections, typed and validated together.

Hook sections are ``None`` when the hook is off. Their dataclasses: ``config/hook_sections.py`` (``kd``, ``onecycle``) and
``sparsity/config.py`` (``sparsity``, ``rigl``, ``gmp``, beside the plain-PyTorch core). Nothing here imports the
data, model or trainer packages: they import the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparsebert.config.hook_sections import DistillationConfig, OneCycleConfig
from sparsebert.config.schema import ConfigError
from sparsebert.config.sections import (
    FLAT_COMM_HOOKS,
    CsvTaskConfig,
    DataConfig,
    FinetuneConfig,
    ModelConfig,
    TrainConfig,
)
from sparsebert.sparsity.config import (
    GMPConfig,
    RigLConfig,
    SparsityConfig,
    check_gmp_fits,
    check_mask_evolution,
    check_schedules_fit,
)

GLUE_TASK_NAMES = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
# tasks that train on the pretraining corpus: MLM, and upstream pruning of a pretrained encoder by distillation
PRETRAINING_TASKS = ("mlm", "upstream")
TASKS = (*PRETRAINING_TASKS, "glue", *(f"glue:{t}" for t in GLUE_TASK_NAMES), "squad_v1", "squad_v2", "gap", "csv")
DEFAULT_SEED = 42
SEEDS = 2**32  # transformers' set_seed seeds numpy, whose seeds are 0 .. 2**32 - 1


def glue_task_key(task: str) -> str:
    """A GLUE task name as the task table keys it: ``SST-2``, ``sts_b``, ``MNLI`` -> ``sst2``, ``stsb``, ``mnli``."""
    return task.lower().replace("-", "").replace("_", "")


@dataclass
class ExperimentConfig:
    name: str
    description: str = ""
    task: str = "mlm"
    seed: int = DEFAULT_SEED
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sparsity: SparsityConfig | None = None  # which weights are sparse; static masks unless rigl or gmp is set
    rigl: RigLConfig | None = None
    gmp: GMPConfig | None = None
    kd: DistillationConfig | None = None
    onecycle: OneCycleConfig | None = None
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    csv: CsvTaskConfig | None = None  # task "csv": the file and its columns

    @property
    def is_finetuning(self) -> bool:
        return self.task not in PRETRAINING_TASKS

    def _check_task_names(self) -> None:
        """GLUE task names and runs_per_task keys now, not when the data loads (or never: a key that matches no
        task was silently ignored)."""
        for name in self.finetune.glue_tasks or []:
            if glue_task_key(name) not in GLUE_TASK_NAMES:
                raise ConfigError(f"finetune.glue_tasks: unknown GLUE task {name!r}: expected one of "
                                  f"{', '.join(GLUE_TASK_NAMES)}")
        known = {*GLUE_TASK_NAMES} | (set() if self.task.startswith("glue") else {self.task})
        for key in ("runs_per_task", "epochs_per_task"):
            unknown = sorted(set(getattr(self.finetune, key)) - known)
            if unknown:
                raise ConfigError(f"finetune.{key}: unknown task name(s) {unknown}; use {', '.join(sorted(known))}")
        if self.finetune.epochs_per_task and self.train.epochs is None:
            raise ConfigError("finetune.epochs_per_task needs train.epochs (an epoch-counted run)")

    def _check_seeds(self) -> None:
        """The seed, and a finetuning job's last run's (seed + runs - 1), are seeds set_seed takes: refused now,
        not with a traceback once the run directory exists."""
        runs = max([self.finetune.num_runs, *self.finetune.runs_per_task.values()]) if self.is_finetuning else 1
        if not 0 <= self.seed <= SEEDS - runs:
            runs_seeds = f" (its {runs} runs per task take seeds seed .. seed + {runs - 1})" if runs > 1 else ""
            raise ConfigError(f"seed must be in [0, 2**32 - {runs}]{runs_seeds}, got {self.seed}")

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        self._check_seeds()
        if self.data.max_seq_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"data.max_seq_length={self.data.max_seq_length} is beyond the model's "
                f"model.max_position_embeddings={self.model.max_position_embeddings}")
        for hook in ("rigl", "gmp"):
            if getattr(self, hook) is not None and self.sparsity is None:
                raise ConfigError(f"{hook} needs a sparsity section (the target sparsity and which layers)")
        comm_hook = self.train.ddp.comm_hook
        if comm_hook == "sparse" and self.sparsity is None:
            raise ConfigError("train.ddp.comm_hook=sparse sends only the gradients of active weights: it needs "
                              "a sparsity section")
        if comm_hook in FLAT_COMM_HOOKS:
            # it runs DDP under no_sync: these settings act only while DDP syncs (static_graph crashed under it)
            for key in ("static_graph", "find_unused_parameters", "broadcast_buffers"):
                if getattr(self.train.ddp, key):
                    raise ConfigError(f"train.ddp.{key}=true does not work with train.ddp.comm_hook={comm_hook}, which "
                                      "replaces DDP's reducer; set one of them to its default")
        try:
            check_mask_evolution(self.sparsity, self.rigl, self.gmp)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.gmp is not None and self.gmp.initial_sparsity > 0 and self.sparsity.init == "random":
            # the starting masks come from sparsity.init: random would delete random weights at step 0
            raise ConfigError("gmp.initial_sparsity > 0 prunes at the start by sparsity.init, and init random "
                              "deletes random weights: use sparsity.init=magnitude")
        if self.gmp is not None:
            try:
                check_gmp_fits(self.gmp, self.sparsity)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if self.gmp.rewind_lr and (self.onecycle is not None or self.train.lr_scheduler != "linear"):
                raise ConfigError("gmp.rewind_lr restarts the linear schedule when pruning ends: it needs "
                                  f"train.lr_scheduler=linear and no onecycle section (got {self.train.lr_scheduler}"
                                  + (" and onecycle" if self.onecycle is not None else "") + ")")
        if self.kd is not None and self.kd.hidden_weight > 0 and self.task == "gap":
            raise ConfigError("kd.hidden_weight needs hidden states from the model: the GAP heads return none")
        if self.train.epochs is None:
            # the run length is known now (with epochs only once the data is loaded): a RigL / GMP schedule that
            # does not fit it fails here, not when the Trainer is built
            check_schedules_fit(self.rigl, self.gmp, self.train.max_steps)
        if self.data.static_mask_count and self.is_finetuning:
            raise ConfigError("data.static_mask_count is for MLM pretraining; finetuning has no masked tokens")
        if self.is_finetuning and self.train.stop_after_steps is not None:
            raise ConfigError("train.stop_after_steps is for MLM pretraining (it cuts a pretraining schedule short)")
        if not self.is_finetuning and self.train.epochs is not None:
            raise ConfigError("train.epochs is for finetuning; pretraining runs train.max_steps optimizer steps")
        if self.is_finetuning and not self.model.init_from:
            raise ConfigError(f"task {self.task} finetunes a pretrained model: set model.init_from "
                              "(minilm, a finished run, a model directory or a hub name)")
        if self.is_finetuning:
            self._check_task_names()
        if self.task.startswith("squad") and self.finetune.doc_stride >= self.finetune.max_seq_length:
            raise ConfigError("finetune.doc_stride must be smaller than finetune.max_seq_length")
        if self.task == "csv" and self.csv is None:
            raise ConfigError("task csv needs a csv section (path, text_column, label_column)")
        self._check_distillation_terms()

    def _check_distillation_terms(self) -> None:
        """Task upstream trains nothing but the teacher terms; the attention term exists only there."""
        kd = self.kd
        if self.task == "upstream":
            if not self.model.init_from:
                raise ConfigError("task upstream prunes a pretrained encoder: set model.init_from (minilm, a "
                                  "finished run, a model directory or a hub name)")
            if kd is None or kd.hidden_weight + kd.attention_weight <= 0:
                raise ConfigError("task upstream distils the teacher's layers: set kd.teacher and kd.hidden_weight "
                                  "and/or kd.attention_weight > 0")
            if self.data.static_mask_count:
                raise ConfigError("data.static_mask_count is for MLM pretraining; task upstream masks no tokens")
        elif kd is not None and kd.attention_weight > 0:
            raise ConfigError("kd.attention_weight is for task upstream (its student has no output to distil)")
        if kd is not None and kd.attention_weight > 0:
            if self.model.attn_implementation != "eager":
                raise ConfigError("kd.attention_weight needs the attention probabilities, which only "
                                  "model.attn_implementation=eager returns")
            # eager attention returns the probabilities after dropout: zeros and 1/(1-p)-scaled rows are no
            # distribution to compare with the teacher's (a run with 0.1 logged a training KL 27 x its eval one)
            if self.model.attention_dropout != 0:
                raise ConfigError("kd.attention_weight compares attention probabilities, which eager attention "
                                  "returns after dropout: set model.attention_dropout=0")
