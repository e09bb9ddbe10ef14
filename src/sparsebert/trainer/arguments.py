"""TrainingArguments from an experiment's train section, at any world size."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from transformers import TrainingArguments

from sparsebert.config.sections import TrainConfig
from sparsebert.console import interactive
from sparsebert.distributed import world_size
from sparsebert.errors import SparseBertError
from sparsebert.models.precision import resolve_precision
from sparsebert.trainer.tracking import wandb_dir, wandb_project
from sparsebert.upstream.transformers_trainer import train_on_one_gpu

log = logging.getLogger(__name__)


def batch_layout(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(per-device batch, gradient accumulation) that keep the global batch fixed at any world size."""
    if cfg.per_device_batch_size is None:
        if cfg.global_batch_size % world:
            raise SparseBertError(f"train.global_batch_size={cfg.global_batch_size} is not divisible by the "
                                  f"{world} processes; set train.per_device_batch_size")
        return cfg.global_batch_size // world, 1
    per_step = cfg.per_device_batch_size * world
    if cfg.global_batch_size % per_step:
        raise SparseBertError(f"train.global_batch_size={cfg.global_batch_size} is not a multiple of "
                              f"train.per_device_batch_size={cfg.per_device_batch_size} x {world} processes")
    return cfg.per_device_batch_size, cfg.global_batch_size // per_step




def wandb_has_credentials() -> bool:
    """An API key in WANDB_API_KEY, or the netrc entry ``wandb login`` writes for the wandb host ($NETRC, else
    ~/.netrc; the host from WANDB_BASE_URL, else api.wandb.ai). A missing or unreadable netrc is no credentials."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError, UnicodeDecodeError):
        return False
    return bool(entry and entry[2])


def training_arguments(cfg: TrainConfig, run_dir: Path, seed: int, run_name: str,
                       label_names: list[str] | None = None, finetune: bool = False,
                       evaluate: bool = True) -> TrainingArguments:
    """Pretraining evaluates and checkpoints every N steps; finetuning evaluates every epoch (when there is an
    eval set with labels) and keeps no checkpoints: a finetuning run is short, and its unit of resumption is
    the whole run (finished runs are skipped on --resume)."""
    world = world_size()
    per_device, accumulation = batch_layout(cfg, world)
    precision = resolve_precision(cfg.precision)
    optim = cfg.optim
    if optim == "auto":
        optim = "adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch"
    log.info("global batch %d = %d per device x %d processes x %d accumulation steps; precision %s",
             cfg.global_batch_size, per_device, world, accumulation, precision)
    if "wandb" in cfg.report_to:
        if not wandb_has_credentials():
            os.environ.setdefault("WANDB_MODE", "offline")  # never block a run on a login prompt
        os.environ["WANDB_PROJECT"] = wandb_project(run_name)  # transformers' WandbCallback reads it, else "huggingface"
        os.environ["WANDB_DIR"] = wandb_dir(run_dir)  # wandb.init reads it
    args = TrainingArguments(
        output_dir=str(run_dir),
        run_name=run_name,
        seed=seed,
        max_steps=-1 if cfg.epochs else cfg.max_steps,
        num_train_epochs=cfg.epochs or 1.0,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        per_device_eval_batch_size=cfg.eval_batch_size,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type=cfg.lr_scheduler,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        adam_epsilon=cfg.adam_epsilon,
        max_grad_norm=cfg.max_grad_norm,
        optim=optim,
        bf16=precision in ("bf16", "fp8"),  # fp8: the layers models/fp8.py swaps; the rest under bf16
        fp16=precision == "fp16",
        torch_compile=cfg.torch_compile,
        torch_compile_mode=cfg.torch_compile_mode if cfg.torch_compile else None,
        eval_strategy=("epoch" if evaluate else "no") if finetune else "steps",
        eval_steps=cfg.eval_steps,
        eval_on_start=cfg.eval_at_start and not finetune,
        save_strategy="no" if finetune else "steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,  # a NaN loss must surface (and stop the run), not be averaged away
        report_to=list(cfg.report_to) or "none",
        dataloader_num_workers=cfg.dataloader_workers,
        ddp_find_unused_parameters=cfg.ddp.find_unused_parameters,
        ddp_broadcast_buffers=cfg.ddp.broadcast_buffers,
        ddp_bucket_cap_mb=cfg.ddp.bucket_cap_mb,
        ddp_static_graph=cfg.ddp.static_graph,
        dataloader_pin_memory=torch.cuda.is_available(),
        accelerator_config={"non_blocking": cfg.async_batch_copy and torch.cuda.is_available()},
        remove_unused_columns=False,
        label_names=["labels"] if label_names is None else label_names,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=not interactive(),  # a log file gets one line per log, with the step and time left
    )
    one_gpu_per_process(args)
    if cfg.torch_compile:
        settle_matmul_precision()
    return args


def one_gpu_per_process(args: TrainingArguments) -> None:
    """A process outside a launcher that sees several GPUs trains on the first alone.

    The Transformers Trainer would wrap the model in ``nn.DataParallel`` over all of them and multiply the
    per-device batch by their number, so the global batch would no longer be the experiment's, and the step is
    slow: for BERT-base pretraining two GPUs that way moved fewer sequences per second than one GPU alone.
    Several GPUs train through DDP: ``--gpus N``, ``accelerate launch`` or ``torchrun``."""
    if args.n_gpu > 1:
        log.warning("%d GPUs are visible to this one process: it trains on %s alone (the Trainer would split each "
                    "batch over them with nn.DataParallel); for several GPUs use --gpus N, accelerate launch or "
                    "torchrun", args.n_gpu, args.device)
        train_on_one_gpu(args)


def settle_matmul_precision() -> None:
    """Leave torch's fp32 matmul precision readable through its legacy getter.

    For compiled runs (bf16, or fp32 without ``tf32`` set) transformers turns TF32 on through torch's new API
    (``torch.backends.fp32_precision = "tf32"``). On torch 2.9+ ``torch.get_float32_matmul_precision()`` then
    raises ("mix of the legacy and new APIs"), and Inductor calls it when it autotunes matmuls (``max-autotune*``
    modes): the compile fails. The legacy setter brings both APIs to one state with the same meaning for CUDA
    matmuls (TF32 on = "high").
    """
    try:
        torch.get_float32_matmul_precision()
    except RuntimeError:
        matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
        if matmul == "none":  # inherits the generic setting
            matmul = getattr(torch.backends, "fp32_precision", "ieee")
        torch.set_float32_matmul_precision("high" if matmul == "tf32" else "highest")
