"""DDPTuningMixin: the train.ddp settings that TrainingArguments has no field for.

``find_unused_parameters``, ``broadcast_buffers``, ``bucket_cap_mb`` and ``static_graph`` travel as
TrainingArguments (arguments.py). ``gradient_as_bucket_view`` and the communication hook are set here on the
DistributedDataParallelKwargs handler the Trainer gives Accelerate; Accelerate reads it when it wraps the model
at the start of training, so setting it after ``Trainer.__init__`` is in time. ``split_compiled_graphs=false``
switches Dynamo's DDPOptimizer off for the process (``torch._dynamo.config.optimize_ddp``).
"""

from __future__ import annotations

import logging

import torch
import torch._dynamo

from sparsebert.config.sections import DDPConfig
from sparsebert.errors import SparseBertError

log = logging.getLogger(__name__)


class DDPTuningMixin:
    def __init__(self, *args, ddp: DDPConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if ddp is None:
            return
        # process-wide: set either way, so a later experiment in the same process gets its own setting
        torch._dynamo.config.optimize_ddp = ddp.split_compiled_graphs
        handler = getattr(self.accelerator, "ddp_handler", None)
        if handler is None:
            log.warning("this Accelerate version exposes no DDP handler: train.ddp.gradient_as_bucket_view and "
                        "train.ddp.comm_hook are not applied")
            return
        from accelerate.utils import DDPCommunicationHookType

        if ddp.comm_hook == "bf16" and not torch.cuda.is_available():
            # torch's bf16 hook needs NCCL: without this check the job would fail at the first backward
            raise SparseBertError("train.ddp.comm_hook=bf16 needs CUDA GPUs (NCCL); use none or fp16 here")
        handler.gradient_as_bucket_view = ddp.gradient_as_bucket_view
        handler.comm_hook = DDPCommunicationHookType("no" if ddp.comm_hook == "none" else ddp.comm_hook)
