"""``finetune.gpu_fast_path``: the settings a finetuning experiment trains with on this machine, resolved once,
before its run directory is checked or written (sparsebert/runner.py)."""

from __future__ import annotations

from dataclasses import replace

from sparsebert.config import ExperimentConfig


def trains_on_gpu() -> bool:
    """Whether this process's Trainer trains on a GPU (it uses one whenever torch sees one)."""
    import torch  # here: the runner resolves this before its slow imports

    return torch.cuda.is_available()


# the fast path's runs at once per GPU (finetune.parallel_runs left unset): MiniLM's step at batch 32 keeps a GPU
# busy a quarter of the time (docs/performance.md), and each run needs at most a few GiB; a smaller GPU gets one
# run per GIB_PER_RUN of its memory
GPU_RUNS_AT_ONCE = 4
GIB_PER_RUN = 8


def gpu_runs_at_once() -> int:
    """How many runs of a finetuning job the fast path trains side by side on this machine: per visible GPU up to
    GPU_RUNS_AT_ONCE (one per GIB_PER_RUN of the smallest GPU's memory; the job gives each run one GPU), and at
    most one per CPU core (each run's step is bound by its host)."""
    import torch

    from sparsebert.data.featurize import available_cores

    count = torch.cuda.device_count()
    # the job spreads runs evenly (distributed.gpus.least_used): the smallest GPU must hold its share
    gib = min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / 2**30
    per_gpu = max(1, min(GPU_RUNS_AT_ONCE, int(gib // GIB_PER_RUN)))
    return max(1, min(per_gpu * count, available_cores()))


def with_gpu_fast_path(cfg: ExperimentConfig, on_gpu: bool, runs_at_once: int = 1) -> ExperimentConfig:
    """The experiment with ``finetune.gpu_fast_path`` turned into the settings it stands for on this machine.

    Args:
        cfg: the experiment as asked for.
        on_gpu: whether it trains on a GPU.
        runs_at_once: how many of its runs this process could train side by side on its GPUs
            (``gpu_runs_at_once()``; 1 where runs cannot leave this process: several processes, ``--profile``).

    Returns:
        ``cfg`` itself without ``finetune.gpu_fast_path``. Otherwise a copy with the flag off (consumed) and, on a
        GPU, the model compiled (mode reduce-overhead: one CUDA graph per step; a mode already set with
        ``train.torch_compile=true`` is kept), every batch padded to ``finetune.max_seq_length`` (evaluation too,
        where the task pads per batch) and each epoch's short last training batch dropped: every training step
        has one shape and compiles once; ``finetune.parallel_runs``, where unset, becomes ``runs_at_once``. So the
        run directory's config.json says what ran, and a run finished on a CPU before the flag existed is the same
        experiment as the CPU run of today.
    """
    if not cfg.finetune.gpu_fast_path:
        return cfg
    finetune = replace(cfg.finetune, gpu_fast_path=False)
    if not on_gpu:
        return replace(cfg, finetune=finetune)
    mode = cfg.train.torch_compile_mode if cfg.train.torch_compile else "reduce-overhead"
    train = replace(cfg.train, torch_compile=True, torch_compile_mode=mode, drop_last_batch=True)
    parallel_runs = cfg.finetune.parallel_runs or runs_at_once
    return replace(cfg, train=train, finetune=replace(finetune, pad_to_multiple_of=cfg.finetune.max_seq_length,
                                                      parallel_runs=parallel_runs))
