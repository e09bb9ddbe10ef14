"""The train.ddp settings that TrainingArguments has no field for, and the gradient sync stage of the step.

``find_unused_parameters``, ``broadcast_buffers``, ``bucket_cap_mb`` and ``static_graph`` travel as
TrainingArguments (arguments.py). ``gradient_as_bucket_view`` and the bf16 / fp16 communication hooks are set here
on the DistributedDataParallelKwargs handler the Trainer gives Accelerate; Accelerate reads it when it wraps the
model at the start of training, so setting it after ``Trainer.__init__`` is in time. ``split_compiled_graphs=false``
switches Dynamo's DDPOptimizer off for the process (``set_dynamo_ddp_optimizer``, upstream/torch_ops.py).

``comm_hook=flat`` / ``flat_bf16`` / ``sparse`` are not DDP hooks: DDP's reducer is left out (each backward runs
under ``no_sync``), and after the last backward of an optimizer step sparsebert's own sync averages the gradients
in one flat all-reduce (distributed/all_reduce.py): all of them, in their own dtype or (fp32 ones) rounded to bf16
on the wire, or (sparse runs) only the active weights' ones, before the sparsity hook and clipping see them.
``GradientSync`` is that stage (trainer/step.py runs it); a callback builds its all-reduce once the Trainer has
wrapped the model.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

from sparsebert.config.sections import DEFAULT_FLAT_PIECES, FLAT_COMM_HOOKS, DDPConfig
from sparsebert.distributed import all_reduce
from sparsebert.errors import SparseBertError
from sparsebert.sparsity import SparsityController
from sparsebert.upstream.torch_ops import find_ddp, set_dynamo_ddp_optimizer

log = logging.getLogger(__name__)


def apply_ddp_settings(ddp: DDPConfig, accelerator, torch_compile: bool) -> None:
    """Sets what Accelerate reads when it wraps the model at the start of training (so after ``Trainer.__init__``
    is in time), and Dynamo's process-wide DDPOptimizer switch."""
    # process-wide: set either way, so a later experiment in the same process gets its own setting
    set_dynamo_ddp_optimizer(ddp.split_compiled_graphs)
    if ddp.comm_hook in FLAT_COMM_HOOKS:
        plugin = getattr(accelerator.state, "dynamo_plugin", None)
        per_layer = bool(getattr(plugin, "use_regional_compilation", False))
        if not torch_compile or ddp.split_compiled_graphs or per_layer:
            log.warning("train.ddp.comm_hook=%s was measured with one whole-model compiled graph only "
                        "(train.torch_compile=true, train.ddp.split_compiled_graphs=false); eager and per-layer "
                        "runs give up DDP's overlap of the all-reduce with the backward, and a split graph has "
                        "nothing left to overlap", ddp.comm_hook)
    handler = getattr(accelerator, "ddp_handler", None)
    if handler is None:
        log.warning("this Accelerate version exposes no DDP handler: train.ddp.gradient_as_bucket_view and "
                    "train.ddp.comm_hook=bf16 / fp16 are not applied")
        return
    from accelerate.utils import DDPCommunicationHookType

    if ddp.comm_hook == "bf16" and not torch.cuda.is_available():
        # torch's bf16 hook needs NCCL: without this check the job would fail at the first backward
        raise SparseBertError("train.ddp.comm_hook=bf16 needs CUDA GPUs (NCCL); use none or fp16 here")
    handler.gradient_as_bucket_view = ddp.gradient_as_bucket_view
    handler.comm_hook = DDPCommunicationHookType(ddp.comm_hook if ddp.comm_hook in ("bf16", "fp16") else "no")


class GradientSync:
    """The sync stage: sparsebert's flat / sparse all-reduce where ``train.ddp.comm_hook`` asks for it, else
    nothing (DDP's reducer averages inside the backward, or there is one process).

    ``attach`` builds the all-reduce for the DDP module the Trainer trains (at the start of training: only then is
    the model wrapped); ``backward`` is the context the micro-batches' backward runs in; a call after the last one
    returns the all-reduce's ``SyncResult``, or None where this stage does nothing.
    """

    def __init__(self, comm_hook: str, pieces: int, controller: SparsityController | None):
        self.comm_hook = comm_hook
        self.pieces = pieces
        self.controller = controller if comm_hook == "sparse" else None
        self.flat: all_reduce.FlatGradientSync | None = None  # built at the start of training
        self._built_for: DistributedDataParallel | None = None

    @classmethod
    def from_config(cls, ddp: DDPConfig | None, controller: SparsityController | None) -> GradientSync | None:
        if ddp is None or ddp.comm_hook not in FLAT_COMM_HOOKS:
            return None
        return cls(ddp.comm_hook, DEFAULT_FLAT_PIECES if ddp.flat_pieces is None else ddp.flat_pieces, controller)

    def attach(self, model_wrapped, world_size: int) -> None:
        ddp_module = find_ddp(model_wrapped)
        if ddp_module is None and world_size > 1:
            raise SparseBertError(f"train.ddp.comm_hook={self.comm_hook} works with DDP (accelerate launch or "
                                  "torchrun), not with FSDP or DeepSpeed")
        if ddp_module is None or ddp_module is self._built_for:  # one process; or train() called again
            return
        if self.comm_hook == "sparse" and self.controller is None:
            raise SparseBertError("train.ddp.comm_hook=sparse needs a sparsity section (which weights are masked)")
        wire_dtype = torch.bfloat16 if self.comm_hook == "flat_bf16" else None
        self.flat = all_reduce.FlatGradientSync(ddp_module.module, self.controller, ddp_module.process_group,
                                                wire_dtype, self.pieces)
        self._built_for = ddp_module

    def backward(self, model):
        """DDP's reducer stays out of the backward where the flat all-reduce runs after it (it would all-reduce,
        and copy, every gradient)."""
        if self.flat is None:
            return contextlib.nullcontext()
        # the sync exists only where attach found DDP in the model the Trainer trains (this one)
        return find_ddp(model).no_sync()

    def __call__(self, track_norm: bool) -> all_reduce.SyncResult | None:
        return None if self.flat is None else self.flat(track_norm=track_norm)

    def log_values(self) -> dict[str, float]:
        """For ``comm_hook=sparse``: the share of gradient values sent (1.0 = plain DDP)."""
        if self.flat is None or self.flat.controller is None:
            return {}
        return {"ddp/allreduce_sent_fraction": round(self.flat.sent_fraction(), 4)}


class FlatAllReduceCallback(TrainerCallback):
    """Builds the flat all-reduce once the Trainer has wrapped the model (single-process runs have none); logs
    the sparse mode's sent share after every step."""

    def __init__(self, sync: GradientSync, trainer):
        self.sync = sync
        self.trainer = trainer  # read only: the model the Trainer wrapped, the pending logs

    @property
    def comm_hook(self) -> str:
        return self.sync.comm_hook

    @property
    def pieces(self) -> int:
        return self.sync.pieces

    def on_train_begin(self, args, state, control, **kwargs):
        self.sync.attach(self.trainer.model_wrapped, args.world_size)

    def on_step_end(self, args, state, control, **kwargs):
        values = self.sync.log_values()
        if values:
            self.trainer.pending_logs.add(values)
