"""The torch.compile settings that TrainingArguments has no field for.

The Trainer hands ``torch.compile`` to Accelerate (a TorchDynamoPlugin from ``train.torch_compile`` and
``train.torch_compile_mode``), which compiles the prepared model at the start of training, so changing the
plugin after ``Trainer.__init__`` is in time (the plugin exists only from then on, so SparseBertTrainer applies
them there). Two plugin settings are added here:

- ``train.torch_compile_scope=layers``: the plugin's ``use_regional_compilation``, which compiles each block of
  a ModuleList of identical blocks (the encoder layers) and every other leaf part (embeddings, heads) on its own
  (``accelerate.utils.compile_regions``). Identical layers share one compiled graph, so compiling takes a
  fraction of the time, and between compiled layers the ordinary autograd engine runs DDP's per-parameter hooks,
  so DDP gets overlap points without Dynamo splitting graphs at the buckets (``train.ddp.split_compiled_graphs=
  false``; Dynamo's DDPOptimizer otherwise splits every graph compiled inside DDP's forward, per-layer ones too).
  For BERT-base pretraining it is faster than eager, but slower than one whole-model graph, on one GPU and
  under DDP alike (docs/performance.md).
- ``train.torch_compile_dynamic``: the plugin's ``dynamic``. ``None`` is torch's default: the first batch
  compiles for its exact shape, and the first batch of another shape compiles again with the changed sizes
  symbolic (finetuning with dynamic padding compiles three times: one shape, another sequence length, the last
  short batch). ``true`` compiles once with symbolic sizes; under ``reduce-overhead`` CUDA graphs are still
  recorded per concrete shape, which is cheap next to a compile.

A third is Inductor's own: ``train.torch_compile_tune_kernels`` sets ``coordinate_descent_tuning``, which
benchmarks block sizes and warp counts around each generated Triton kernel's default. It is a process-wide
Inductor setting (torch.compile takes ``mode`` or ``options``, not both, and reduce-overhead runs need the
mode), so every compiled run sets it either way and a later experiment in the same process gets its own; off
means the process's default (``TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1`` still turns it on). It stays set for
whatever the process compiles afterwards, and the max-autotune modes turn it on for their own compiles anyway. It
needs no Trainer, so it is set with the model transforms before one is built (models/prepare.py).
"""

from __future__ import annotations

from sparsebert.errors import SparseBertError
from sparsebert.upstream.torch_ops import set_kernel_tuning


def apply_kernel_tuning(tune_kernels: bool | None) -> None:
    if tune_kernels is not None:  # None: not a compiled run, Inductor is not used
        set_kernel_tuning(tune_kernels)


def apply_compile_plugin_options(accelerator, compile_scope: str | None, compile_dynamic: bool | None) -> None:
    if compile_scope != "layers" and compile_dynamic is None:
        return
    plugin = getattr(accelerator.state, "dynamo_plugin", None)
    if plugin is None:
        raise SparseBertError("train.torch_compile_scope / torch_compile_dynamic need Accelerate's "
                              "TorchDynamoPlugin; upgrade accelerate")
    if compile_scope == "layers":
        if not hasattr(plugin, "use_regional_compilation"):
            raise SparseBertError("train.torch_compile_scope=layers needs an Accelerate with regional "
                                  "compilation (TorchDynamoPlugin.use_regional_compilation); upgrade accelerate "
                                  "or use model")
        plugin.use_regional_compilation = True
    if compile_dynamic is not None:
        plugin.dynamic = compile_dynamic
