"""Building the Trainer hooks (sparsity, distillation, one-cycle) from an experiment's sections."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import nn

from sparsebert.config import ExperimentConfig, to_dict
from sparsebert.config.sections import FLAT_COMM_HOOKS
from sparsebert.errors import SparseBertError
from sparsebert.sparsity import SparsityController


def build_hooks(cfg: ExperimentConfig, model: nn.Module, total_steps: int, seed: int,
                teacher_source: str | None = None,
                load_teacher: Callable[[str], nn.Module] | None = None) -> dict[str, Any]:
    """The keyword arguments that switch SparseBertTrainer's hooks on (``ddp`` and the compile options alone
    train dense). The model transforms are not among them: ``prepare_model`` (models/prepare.py) applies those
    before the Trainer is built."""
    compiled = cfg.train.torch_compile
    ddp = cfg.train.ddp
    if ddp.split_compiled_graphs is None:
        # the split lets DDP's all-reduce overlap the backward: per-layer graphs already give DDP those points, and
        # the flat all-reduce runs after the backward (no_sync), so neither needs it
        per_layer = compiled and cfg.train.torch_compile_scope == "layers"
        ddp = replace(ddp, split_compiled_graphs=not per_layer and ddp.comm_hook not in FLAT_COMM_HOOKS)
    hooks: dict[str, Any] = {"ddp": ddp,
                             "compile_scope": cfg.train.torch_compile_scope if compiled else None,
                             "compile_dynamic": cfg.train.torch_compile_dynamic if compiled else None,
                             "compile_tune_kernels": cfg.train.torch_compile_tune_kernels if compiled else None,
                             "drop_last_batch": cfg.train.drop_last_batch,
                             "clip_in_optimizer": cfg.train.clip_in_optimizer,
                             "experiment": to_dict(cfg)}  # every section, for the W&B config / TensorBoard hparams
    if cfg.kd is not None:
        # the teacher first: a student that starts from it must hold its weights before magnitude masks are drawn
        hooks["distillation"] = (cfg.kd, _teacher(cfg, model, teacher_source, load_teacher))
    if cfg.sparsity is not None:
        try:
            hooks["sparsity"] = SparsityController(model, cfg.sparsity, rigl=cfg.rigl, gmp=cfg.gmp,
                                                   total_steps=total_steps, seed=seed)
        except ValueError as e:
            # settings that only fail against this model or run length (an include matching no weight, a RigL / GMP
            # range beyond an epoch-counted run): the controller names the key, the CLI prints it in one line
            raise SparseBertError(str(e)) from None
    if cfg.onecycle is not None:
        hooks["onecycle"] = cfg.onecycle
    return hooks


def _teacher(cfg: ExperimentConfig, student: nn.Module, source: str | None,
             load_teacher: Callable[[str], nn.Module] | None) -> nn.Module:
    """The distillation teacher; with ``kd.student_from_teacher`` its weights are copied into the student."""
    if source is None or load_teacher is None:
        raise SparseBertError(f"distillation is not supported for task {cfg.task}")
    teacher = load_teacher(source)
    t_vocab = getattr(teacher.config, "vocab_size", None)
    if t_vocab != getattr(student.config, "vocab_size", None):
        raise SparseBertError(f"kd.teacher {cfg.kd.teacher} has a vocabulary of {t_vocab}, the student "
                              f"{student.config.vocab_size}: they must share the tokenizer")
    if cfg.kd.hidden_weight > 0:
        shapes = [(getattr(m.config, "num_hidden_layers", None), getattr(m.config, "hidden_size", None))
                  for m in (student, teacher)]
        if shapes[0] != shapes[1]:
            raise SparseBertError(f"kd.hidden_weight needs a teacher of the student's shape (layers, hidden size): "
                                  f"the student is {shapes[0]}, kd.teacher {cfg.kd.teacher} {shapes[1]}")
    if cfg.kd.student_from_teacher:
        try:
            student.load_state_dict(teacher.state_dict())
        except RuntimeError as e:
            first = str(e).strip().splitlines()[-1].strip()
            raise SparseBertError(f"kd.student_from_teacher: the teacher {source} does not have the student's "
                                  f"layers ({first})") from None
    return teacher
