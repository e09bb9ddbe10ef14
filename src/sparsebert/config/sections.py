"""The typed sections every experiment has: model, data, train.

Each section validates itself (``validate``) when the experiment is built, and names the key that is wrong.
Sections that belong to a hook (sparsity, RigL, distillation, ...) live next to that hook's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

# Named BERT sizes: (layers, hidden). Heads = hidden / 64, intermediate = 4 * hidden, as in the BERT papers.
MODEL_SIZES: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

PRECISIONS = ("auto", "bf16", "fp16", "fp32", "fp8")
# torchao's Float8LinearConfig.from_recipe_name, and tensorwise with the weight gradient in bf16 (models/fp8.py)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "tensorwise_with_gw_hp")
FP8_LAYERS = ("encoder", "auto")  # every encoder Linear, or those torchao's shape heuristic picks (models/fp8.py)
CORPUS_FORMATS = ("wikiextractor", "text", "hub")
CSV_QUOTING = ("standard", "none")  # csv.quoting: how the CSV task reads quotes (CsvTaskConfig.quoting)


@dataclass
class ModelConfig:
    size: str = "base"  # a named size (MODEL_SIZES); ignored when init_from is set
    init_from: str | None = None  # "minilm" (package-shipped), a run dir or checkpoint dir, or a hub name
    tokenizer: str = "minilm"  # "minilm" (its uncased WordPiece vocab), a local path, or a hub name
    attn_implementation: str = "sdpa"  # "sdpa" uses FlashAttention / memory-efficient kernels on GPU
    max_position_embeddings: int = 512
    # LayerNorm outputs (the residual stream) in bf16 instead of fp32 under bf16 training (left off under fp16,
    # whose range it can overflow); weights and optimizer state stay fp32 (models/residual_precision.py)
    half_precision_residual: bool = False
    # under train.torch_compile: dropout whose random bits come from a counter hash instead of Philox (the same
    # keep probability, another random stream; models/fast_dropout.py)
    fast_dropout: bool = False
    # Q, K and V of each attention layer as one matrix product of the concatenated weights (the parameters stay
    # three; models/fused_qkv.py)
    fused_qkv: bool = False
    # None: the checkpoint's own value with init_from, else BERT's 0.1
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    # with init_from: keep only the checkpoint's first N encoder layers (a shallower student, or a fast CPU smoke
    # run); None keeps them all
    num_layers: int | None = None

    def validate(self) -> None:
        if self.init_from is None and self.size not in MODEL_SIZES:
            raise ValueError(f"model.size must be one of {', '.join(MODEL_SIZES)}, got {self.size!r}")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2"):
            raise ValueError(f"model.attn_implementation must be sdpa, eager or flash_attention_2, "
                             f"got {self.attn_implementation!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.num_layers is not None:
            if self.init_from is None:
                raise ValueError("model.num_layers keeps the first layers of a pretrained model: set model.init_from, "
                                 "or pick a model.size")
            if self.num_layers < 1:
                raise ValueError(f"model.num_layers must be at least 1, got {self.num_layers}")


@dataclass
class DataConfig:
    # Local corpus, relative to the data directory ($SPARSEBERT_DATA / --data-dir): a directory or one file.
    corpus: str = "wikipedia-enwiki-2015-wikiextractor"
    format: str = "wikiextractor"  # "wikiextractor" | "text" (blank line between documents) | "hub"
    # Used when no data directory is configured, or format == "hub": any dataset on the Hugging Face hub.
    hub_name: str = "wikimedia/wikipedia"
    hub_config: str | None = "20231101.en"
    hub_split: str = "train"
    text_column: str = "text"
    max_files: int | None = None  # read only the first N corpus files (sorted): quick runs
    max_documents: int | None = None
    eval_documents: int = 100  # whole documents held out for evaluation (never lines of one article)
    max_eval_samples: int | None = 2000  # cap on eval blocks, to keep evaluation cheap
    max_seq_length: int = 128
    mlm_probability: float = 0.15
    # static shapes for the MLM decoder: it always runs on a fixed number of rows per training batch (the expected
    # masked count + 8 standard deviations; the collator never masks more), so a compiled step has no
    # data-dependent shape (one graph, CUDA graphs possible); the loss is the same
    static_mask_count: bool = False
    num_proc: int | None = None  # tokenization worker processes; None: all cores, at most 16

    def validate(self) -> None:
        if self.format not in CORPUS_FORMATS:
            raise ValueError(f"data.format must be one of {', '.join(CORPUS_FORMATS)}, got {self.format!r}")
        if not 8 <= self.max_seq_length <= 4096:
            raise ValueError(f"data.max_seq_length must be in [8, 4096], got {self.max_seq_length}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"data.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.eval_documents < 1:
            raise ValueError(f"data.eval_documents must be >= 1, got {self.eval_documents}")
        for name in ("max_files", "max_documents", "max_eval_samples", "num_proc"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.{name} must be >= 1 or None, got {value}")


# train.ddp.comm_hook values that replace DDP's reducer by sparsebert's flat all-reduce after the backward
FLAT_COMM_HOOKS = ("flat", "flat_bf16", "sparse")
# pieces of that all-reduce unless train.ddp.flat_pieces says otherwise: faster than one piece for sparse runs,
# no slower for dense ones (docs/performance.md, multi-GPU scaling)
DEFAULT_FLAT_PIECES = 3


@dataclass
class DDPConfig:
    """DistributedDataParallel settings (multi-process runs only). The defaults are the fast ones for BERT.

    Transformers' Trainer turns ``find_unused_parameters`` on for every model without activation checkpointing,
    which makes DDP walk the autograd graph after each forward; every sparsebert model uses all of its
    parameters in the loss, so it is off here. BERT's buffers (position ids) never change, so they are not
    broadcast from rank 0 before each forward either.
    """

    find_unused_parameters: bool = False  # True only for a custom model that leaves parameters out of the loss
    broadcast_buffers: bool = False
    bucket_cap_mb: int = 25  # gradient bucket size: all-reduce of one bucket overlaps the rest of the backward
    static_graph: bool = False
    # gradients live in the all-reduce buckets: no copy kernel per parameter and step, less memory
    gradient_as_bucket_view: bool = True
    # "bf16" / "fp16": DDP's hooks, all-reduce gradients in half precision (half the bytes on the wire, rounded
    # gradients). Instead of DDP's reducer, one flat all-reduce after the backward (distributed/all_reduce.py;
    # for one whole-model compiled graph, whose gradients are all ready only at its end): "flat" of every
    # gradient, the same averages up to summation order; "flat_bf16" the same rounded to bf16 on the wire;
    # "sparse" (runs with a sparsity section) of only the active weights' gradients, the dense gradient on steps
    # with a RigL update
    comm_hook: str = "none"
    # flat, flat_bf16, sparse: cut the flat all-reduce into up to this many pieces (from 3 on, the first and last
    # 1/8 of the values each and the rest equal; 2: 1/8 and 7/8; fewer where a buffer is too small), each sent as
    # soon as its gradients are copied in, so the copies overlap the all-reduce of another piece; None:
    # DEFAULT_FLAT_PIECES
    flat_pieces: int | None = None
    # torch.compile under DDP: Dynamo's DDPOptimizer splits every graph compiled inside DDP's forward at the
    # gradient buckets, so each bucket's all-reduce can start inside the graph's backward. With
    # train.torch_compile_scope=layers the layer boundaries already give DDP those points, and the split made
    # per-layer graphs slower than eager. None (default):
    # split a whole-model graph, not per-layer ones, nor any graph under comm_hook=flat, flat_bf16 or sparse
    # (nothing to overlap);
    # true / false: always / never
    # (Dynamo's optimize_ddp, process-wide: upstream/torch_ops.py)
    split_compiled_graphs: bool | None = None

    def validate(self) -> None:
        if self.bucket_cap_mb < 1:
            raise ValueError(f"train.ddp.bucket_cap_mb must be >= 1, got {self.bucket_cap_mb}")
        if self.comm_hook not in ("none", "bf16", "fp16", *FLAT_COMM_HOOKS):
            raise ValueError("train.ddp.comm_hook must be none, bf16, fp16, flat, flat_bf16 or sparse, got "
                             f"{self.comm_hook!r}")
        if self.flat_pieces is None:
            return
        if self.flat_pieces < 1:
            raise ValueError(f"train.ddp.flat_pieces must be >= 1, got {self.flat_pieces}")
        if self.comm_hook not in FLAT_COMM_HOOKS:
            raise ValueError(f"train.ddp.flat_pieces={self.flat_pieces} cuts sparsebert's flat all-reduce "
                             f"(comm_hook=flat, flat_bf16 or sparse), not comm_hook={self.comm_hook}")


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps (ignored when epochs is set)
    # end the run after this many optimizer steps while the LR, RigL and GMP schedules still span max_steps: the
    # early phase of a long run at a fraction of its cost (an ablation of when a run leaves the loss plateau)
    stop_after_steps: int | None = None
    epochs: float | None = None  # finetuning: passes over the training set instead of max_steps
    global_batch_size: int = 256  # sequences per optimizer step, at any number of GPUs
    per_device_batch_size: int | None = None  # None: global / world size; else accumulate to reach global
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 0
    lr_scheduler: str = "linear"  # any transformers scheduler name; the onecycle section overrides it
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    # clip inside the fused AdamW step (its grad_scale divides each gradient) instead of a separate pass that
    # multiplies every gradient; the same update up to rounding; only with a fused torch Adam / AdamW and no fp16
    # loss scaler, elsewhere the Trainer clips as usual (trainer/clipping.py)
    clip_in_optimizer: bool = True
    optim: str = "auto"  # "auto": fused AdamW on GPU, plain AdamW on CPU; or any transformers optim name
    # "auto": bf16 where the GPU supports it, else fp32; "fp8": the encoder's Linear layers multiply in FP8 (torchao,
    # sm89+ GPUs), the rest as under bf16 (models/fp8.py)
    precision: str = "auto"
    # with precision fp8: scales per tensor or per row, weight gradients in FP8 or bf16 (FP8_RECIPES)
    fp8_recipe: str = "tensorwise"
    fp8_layers: str = "encoder"  # with precision fp8: which Linear layers (FP8_LAYERS)
    eval_steps: int = 1000
    eval_at_start: bool = True  # report the eval loss before training too
    eval_batch_size: int = 128  # per device
    save_steps: int = 1000
    save_total_limit: int | None = 2
    logging_steps: int = 50
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])  # tensorboard, wandb
    dataloader_workers: int = 2
    # copy each batch to the GPU from pinned memory without waiting: a blocking copy (the Trainer's default)
    # waits until the GPU has finished the previous step, so the GPU then idles for the host's whole per-step
    # work, and under DDP every rank's host delay reaches all ranks; GPU only
    async_batch_copy: bool = True
    # drop each epoch's last, short batch: with torch.compile every batch then has the same size, which saves a
    # recompile (and, under reduce-overhead, a CUDA graph); the dropped rows differ per epoch when shuffled;
    # evaluation never drops rows
    drop_last_batch: bool = False
    torch_compile: bool = False
    # torch.compile mode: "default", "reduce-overhead" (CUDA graphs: fewer launches for small models),
    # "max-autotune", "max-autotune-no-cudagraphs"
    torch_compile_mode: str = "default"
    # what torch.compile wraps: "model" (one graph) or "layers" (each encoder layer and each other part compiled
    # on its own, Accelerate's regional compilation: identical layers share one compile, and between layers
    # DDP's all-reduce hooks run as in eager mode); see trainer/compile_options.py
    torch_compile_scope: str = "model"
    # symbolic shapes: None = torch's default (exact shapes first, recompile symbolic on a new shape); true =
    # symbolic from the first compile (one compile for all padded lengths and the last short batch); false = a
    # compile per distinct shape (past Dynamo's recompile limit, 8 by default, further shapes run uncompiled)
    torch_compile_dynamic: bool | None = None
    # Inductor's coordinate-descent tuning of its own Triton kernels (block sizes, warps), set for the process:
    # the pointwise and normalization kernels run faster, for a longer first compile (for BERT-base pretraining
    # it paid for sparse runs, not for dense ones; docs/performance.md). Matrix products keep cuBLAS. The
    # max-autotune modes tune kernels whatever this says
    torch_compile_tune_kernels: bool = False
    ddp: DDPConfig = field(default_factory=DDPConfig)

    def validate(self) -> None:
        self.ddp.validate()
        if self.epochs is not None and not 0 < self.epochs < math.inf:
            raise ValueError(f"train.epochs must be > 0 and finite, got {self.epochs}")
        for name in ("max_steps", "global_batch_size", "eval_steps", "save_steps", "logging_steps",
                     "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.stop_after_steps is not None and not 1 <= self.stop_after_steps < self.max_steps:
            raise ValueError(f"train.stop_after_steps must be in [1, train.max_steps={self.max_steps}), "
                             f"got {self.stop_after_steps}")
        if self.per_device_batch_size is not None and self.per_device_batch_size < 1:
            raise ValueError(f"train.per_device_batch_size must be >= 1, got {self.per_device_batch_size}")
        if not 0 < self.learning_rate < math.inf:  # also refuses nan
            raise ValueError(f"train.learning_rate must be > 0 and finite, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        self._check_optimizer_numbers()
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"train.fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_layers not in FP8_LAYERS:
            raise ValueError(f"train.fp8_layers must be one of {', '.join(FP8_LAYERS)}, got {self.fp8_layers!r}")
        if self.fp8_layers == "auto" and self.fp8_recipe == "rowwise_with_gw_hp":  # torchao has no shape rule for it
            raise ValueError("train.fp8_layers=auto has no shape rule for train.fp8_recipe=rowwise_with_gw_hp: use "
                             "fp8_layers=encoder or another recipe")
        # transformers would refuse these only when TrainingArguments are built, after the run directory exists
        if self.lr_scheduler not in COMMON_SCHEDULERS and self.lr_scheduler not in (schedulers := scheduler_names()):
            raise ValueError(f"train.lr_scheduler must be one of {', '.join(schedulers)}, got {self.lr_scheduler!r}")
        if self.optim not in COMMON_OPTIMIZERS and self.optim not in (optims := optimizer_names()):
            raise ValueError(f"train.optim must be auto or a transformers optimizer name ({', '.join(optims[1:])}), "
                             f"got {self.optim!r}")
        unknown = set(self.report_to) - {"tensorboard", "wandb"}
        if unknown:
            raise ValueError(f"train.report_to: unknown tracker(s) {sorted(unknown)}; use tensorboard, wandb")
        if self.dataloader_workers < 0:
            raise ValueError(f"train.dataloader_workers must be >= 0, got {self.dataloader_workers}")
        modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.torch_compile_mode not in modes:
            raise ValueError(f"train.torch_compile_mode must be one of {', '.join(modes)}, "
                             f"got {self.torch_compile_mode!r}")
        if self.torch_compile_scope not in ("model", "layers"):
            raise ValueError(f"train.torch_compile_scope must be model or layers, got {self.torch_compile_scope!r}")
        if self.torch_compile_tune_kernels and not self.torch_compile:
            raise ValueError("train.torch_compile_tune_kernels tunes compiled kernels: it needs train.torch_compile=true")

    def _check_optimizer_numbers(self) -> None:
        """torch refuses some of these only when the optimizer is built, after the run directory exists, and
        accepts adam_epsilon=0, which turns every masked weight into NaN: the update of a weight whose gradient and
        moments are all 0 is 0 / (0 + eps), and the mask cannot zero a NaN."""
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:  # also refuses nan
                raise ValueError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.adam_epsilon < math.inf:
            raise ValueError(f"train.adam_epsilon must be > 0 and finite, got {self.adam_epsilon}")
        for name in ("weight_decay", "max_grad_norm"):  # max_grad_norm 0: no clipping
            if not 0.0 <= getattr(self, name) < math.inf:
                raise ValueError(f"train.{name} must be >= 0 and finite, got {getattr(self, name)}")


# names every supported transformers accepts (a test checks them against the installed one): a config that uses
# them is validated without importing transformers, which imports torch (seconds; --show and --list need neither)
COMMON_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                     "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")
COMMON_OPTIMIZERS = ("auto", "adamw_torch", "adamw_torch_fused", "adafactor", "sgd")


def scheduler_names() -> list[str]:
    from transformers import SchedulerType  # imported here: most config code needs no transformers

    return [s.value for s in SchedulerType]


def optimizer_names() -> list[str]:
    from transformers.training_args import OptimizerNames

    return ["auto", *(o.value for o in OptimizerNames)]


GAP_HEADS = ("concat", "mul", "segment")


@dataclass
class FinetuneConfig:
    """Settings of finetuning jobs (task = glue, glue:<task>, squad_v1, squad_v2, gap, csv)."""

    max_seq_length: int = 128
    # dynamic padding pads each batch to its longest row, rounded up to this multiple (tensor-core friendly
    # shapes, and few distinct shapes for torch.compile); None: no rounding
    pad_to_multiple_of: int | None = 8
    # on a GPU, the one-shape path: compiled with CUDA graphs (reduce-overhead; a mode set with
    # train.torch_compile=true is kept), every batch padded to max_seq_length and each epoch's short last training
    # batch dropped, so the training step compiles once and replays as one graph (MiniLM at batch 32 is bound by
    # the host's launches: docs/performance.md). A CPU run stays eager with dynamic padding. Resolved before the
    # run directory is written, whose config.json records the settings it ran with (jobs/finetune/fast_path.py)
    gpu_fast_path: bool = False
    num_runs: int = 1  # runs per task with seeds seed, seed + 1, ...; all are kept
    # runs of the job trained at once, each in a process of its own (jobs/finetune/parallel.py): a small model at a
    # small batch leaves a GPU mostly idle, so the many runs of a GLUE job can share it; with several GPUs each run
    # gets one. 1: one after another; unset: 1, except that the GPU fast path runs up to 4 at once per GPU where
    # it has room (fast_path.py)
    parallel_runs: int | None = None
    runs_per_task: dict[str, int] = field(default_factory=dict)  # e.g. {"rte": 3}: overrides num_runs
    # e.g. {"sst2": 3}: overrides train.epochs for that task (a large task needs fewer passes than a small one)
    epochs_per_task: dict[str, float] = field(default_factory=dict)
    glue_tasks: list[str] | None = None  # task "glue": None = every task present in the data directory
    max_train_samples: int | None = None  # slices for quick CPU runs
    max_eval_samples: int | None = None
    save_model: bool = True  # export model/ (a distillation teacher for the sparse runs needs it)
    # SQuAD: only dev files exist offline, so one file can be split by article into train/eval parts
    squad_train_file: str | None = None  # under the data dir; None: split squad_file
    squad_file: str = "squad/dev-v1.1.json"
    squad_eval_fraction: float = 0.2
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    # GAP
    gap_head: str = "mul"
    gap_train_file: str = "gap/gap-development.tsv"
    gap_eval_file: str = "gap/gap-validation.tsv"
    gap_bad_rows: str = "error"  # "error" | "skip" (skipped rows are logged with their ID)

    def validate(self) -> None:
        if not 16 <= self.max_seq_length <= 4096:
            raise ValueError(f"finetune.max_seq_length must be in [16, 4096], got {self.max_seq_length}")
        if self.glue_tasks is not None and not self.glue_tasks:  # [] is not None: it would read as every task
            raise ValueError("finetune.glue_tasks=[] names no task; name some, or leave it unset for every task present")
        if self.num_runs < 1 or any(v < 1 for v in self.runs_per_task.values()):
            raise ValueError("finetune.num_runs and finetune.runs_per_task values must be >= 1")
        if self.parallel_runs is not None and self.parallel_runs < 1:
            raise ValueError(f"finetune.parallel_runs must be >= 1, got {self.parallel_runs}")
        for key in ("max_train_samples", "max_eval_samples"):  # 0 would read as no limit, a negative one crash late
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"finetune.{key} must be >= 1 or null (no limit), got {getattr(self, key)}")
        if any(isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 for v in self.epochs_per_task.values()):
            raise ValueError(f"finetune.epochs_per_task values must be > 0, got {self.epochs_per_task}")
        if self.gap_head not in GAP_HEADS:
            raise ValueError(f"finetune.gap_head must be one of {', '.join(GAP_HEADS)}, got {self.gap_head!r}")
        if self.gap_bad_rows not in ("error", "skip"):
            raise ValueError(f"finetune.gap_bad_rows must be error or skip, got {self.gap_bad_rows!r}")
        if not 0.0 < self.squad_eval_fraction < 1.0:
            raise ValueError(f"finetune.squad_eval_fraction must be in (0, 1), got {self.squad_eval_fraction}")
        # 0 would make every SQuAD answer empty, or every batch shape unroundable, without an error
        for key in ("n_best_size", "max_answer_length", "doc_stride", "max_query_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"finetune.{key} must be >= 1, got {getattr(self, key)}")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"finetune.pad_to_multiple_of must be >= 1 or null, got {self.pad_to_multiple_of}")


@dataclass
class CsvTaskConfig:
    """An experiment's ``csv`` section."""

    path: str = ""  # relative to the data dir, or absolute
    text_column: str = "text"
    label_column: str = "label"
    id_column: str | None = None  # row id column; default: the row number
    delimiter: str | None = None  # None: by extension (.tsv -> tab, else comma)
    # how double quotes are read, in .csv and .tsv files alike. "standard" (pandas' read_csv default, and what
    # csv.writer and to_csv write): a field may be enclosed in quotes, holding delimiters, line breaks and "" for
    # a quote; an unclosed quote is an error. "none": quotes are plain text and no field holds a delimiter or line
    # break, for files joined by hand whose texts may start with a bare quote (like GLUE's TSVs).
    quoting: str = "standard"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    fold_stride: int = 0  # token overlap between consecutive chunks of a folded text

    def validate(self) -> None:
        for key in ("path", "text_column", "label_column"):
            if not getattr(self, key):
                raise ValueError(f"csv.{key} must be set")
        if self.id_column is not None and not self.id_column:
            raise ValueError("csv.id_column must be a column name or null")
        if self.delimiter is not None and len(self.delimiter) != 1:
            raise ValueError(f"csv.delimiter must be one character or null, got {self.delimiter!r}")
        if self.quoting not in CSV_QUOTING:
            raise ValueError(f"csv.quoting must be one of {', '.join(CSV_QUOTING)}, got {self.quoting!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"csv.val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 < self.test_fraction < 1.0:  # the task's metrics are measured on the test rows
            raise ValueError(f"csv.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("csv.val_fraction + csv.test_fraction must be below 1 (no training rows left)")
        if self.fold_stride < 0:
            raise ValueError(f"csv.fold_stride must be >= 0, got {self.fold_stride}")

    def resolve_path(self, data_dir: str | Path) -> Path:
        path = Path(self.path).expanduser()
        return path if path.is_absolute() else Path(data_dir) / path

    def resolve_delimiter(self, path: str | Path) -> str:
        if self.delimiter is not None:
            return self.delimiter
        return "\t" if Path(path).suffix.lower() == ".tsv" else ","
