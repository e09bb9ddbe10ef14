"""DDPTuningMixin: the train.ddp settings that TrainingArguments has no field for.

``find_unused_parameters``, ``broadcast_buffers``, ``bucket_cap_mb`` and ``static_graph`` travel as
TrainingArguments (arguments.py). ``gradient_as_bucket_view`` and the bf16 / fp16 communication hooks are set here
on the DistributedDataParallelKwargs handler the Trainer gives Accelerate; Accelerate reads it when it wraps the
model at the start of training, so setting it after ``Trainer.__init__`` is in time. ``split_compiled_graphs=false``
switches Dynamo's DDPOptimizer off for the process (``torch._dynamo.config.optimize_ddp``).

``comm_hook=flat`` / ``flat_bf16`` / ``sparse`` are not DDP hooks: DDP's reducer is left out (each backward runs
under ``no_sync``), and after the last backward of an optimizer step sparsebert's own sync averages the gradients
in one flat all-reduce (distributed/all_reduce.py): all of them, in their own dtype or (fp32 ones) rounded to bf16
on the wire, or (sparse runs) only the active weights' ones, before the sparsity hook and clipping see them. A
callback builds the sync once the Trainer has wrapped the model.
"""

from __future__ import annotations

import logging

import torch
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

from sparsebert.config.sections import DEFAULT_FLAT_PIECES, FLAT_COMM_HOOKS, DDPConfig
from sparsebert.distributed import all_reduce
from sparsebert.errors import SparseBertError

log = logging.getLogger(__name__)


class DDPTuningMixin:
    def __init__(self, *args, ddp: DDPConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.gradient_sync: all_reduce.FlatGradientSync | None = None  # built at the start of training
        if ddp is None:
            return
        # process-wide: set either way, so a later experiment in the same process gets its own setting
        torch._dynamo.config.optimize_ddp = ddp.split_compiled_graphs
        if ddp.comm_hook in FLAT_COMM_HOOKS:
            pieces = DEFAULT_FLAT_PIECES if ddp.flat_pieces is None else ddp.flat_pieces
            self.add_callback(FlatAllReduceCallback(self, ddp.comm_hook, pieces))
            plugin = getattr(self.accelerator.state, "dynamo_plugin", None)
            per_layer = bool(getattr(plugin, "use_regional_compilation", False))
            if not self.args.torch_compile or ddp.split_compiled_graphs or per_layer:
                log.warning("train.ddp.comm_hook=%s was measured with one whole-model compiled graph only "
                            "(train.torch_compile=true, train.ddp.split_compiled_graphs=false); eager and per-layer "
                            "runs give up DDP's overlap of the all-reduce with the backward, and a split graph has "
                            "nothing left to overlap", ddp.comm_hook)
        handler = getattr(self.accelerator, "ddp_handler", None)
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

    def training_step(self, model, *args, **kwargs):
        sync = self.gradient_sync
        if sync is None:
            return super().training_step(model, *args, **kwargs)
        # the sync exists only where the callback found DDP in the model the Trainer trains (this one)
        with _find_ddp(model).no_sync():  # the reducer would all-reduce (and copy) every gradient
            loss = super().training_step(model, *args, **kwargs)
        if self.accelerator.sync_gradients:  # the last micro-batch of an optimizer step
            sync()
        return loss


class FlatAllReduceCallback(TrainerCallback):
    """Builds the flat all-reduce for the DDP model at the start of training (single-process runs have none);
    for ``comm_hook=sparse`` logs the share of gradient values it sent (``ddp/allreduce_sent_fraction``, 1.0 =
    plain DDP)."""

    def __init__(self, trainer, comm_hook: str, pieces: int):
        self.trainer = trainer
        self.comm_hook = comm_hook
        self.pieces = pieces
        self._built_for: DistributedDataParallel | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        ddp_module = _find_ddp(self.trainer.model_wrapped)
        if ddp_module is None and args.world_size > 1:
            raise SparseBertError(f"train.ddp.comm_hook={self.comm_hook} works with DDP (accelerate launch or "
                                  "torchrun), not with FSDP or DeepSpeed")
        if ddp_module is None or ddp_module is self._built_for:  # one process; or train() called again
            return
        controller = None
        if self.comm_hook == "sparse":
            controller = getattr(self.trainer, "sparsity", None)
            if controller is None:
                raise SparseBertError("train.ddp.comm_hook=sparse needs a sparsity section (which weights are masked)")
        wire_dtype = torch.bfloat16 if self.comm_hook == "flat_bf16" else None
        self.trainer.gradient_sync = all_reduce.FlatGradientSync(ddp_module.module, controller,
                                                                    ddp_module.process_group, wire_dtype,
                                                                    self.pieces)
        self._built_for = ddp_module

    def on_step_end(self, args, state, control, **kwargs):
        sync = self.trainer.gradient_sync
        if sync is not None and sync.controller is not None:
            self.trainer.pending_logs.add({"ddp/allreduce_sent_fraction": round(sync.sent_fraction(), 4)})


def _find_ddp(model) -> DistributedDataParallel | None:
    """The DDP module under Accelerate's wrapping (torch.compile puts an OptimizedModule around it)."""
    while model is not None and not isinstance(model, DistributedDataParallel):
        model = getattr(model, "_orig_mod", None)
    return model
