"""CompileScopeMixin: ``train.torch_compile_scope=layers`` compiles each part of the model on its own.

The Trainer hands ``torch.compile`` to Accelerate (a TorchDynamoPlugin from ``train.torch_compile`` and
``train.torch_compile_mode``), which compiles the prepared model as one graph, or, with the plugin's
``use_regional_compilation``, each block of a ModuleList of identical blocks (the encoder layers) and every
other leaf part (embeddings, heads) separately (``accelerate.utils.compile_regions``). Why one would:

- identical layers share one compiled graph, so compiling takes a fraction of the time;
- between compiled layers the ordinary autograd engine runs DDP's per-parameter hooks, so DDP gets overlap
  points without Dynamo splitting graphs at the buckets (``train.ddp.split_compiled_graphs=false``; Dynamo's
  DDPOptimizer otherwise splits every graph compiled inside DDP's forward, per-layer ones too).

Measured (docs/benchmarks.md, 4 x H200): +28 % for BERT-base pretraining on one GPU, but slower than eager
under DDP with the split on; the experiments leave it off.

Accelerate reads the plugin when it prepares the model at the start of training, so switching it after
``Trainer.__init__`` is in time.
"""

from __future__ import annotations

from sparsebert.errors import SparseBertError


class CompileScopeMixin:
    def __init__(self, *args, compile_scope: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if compile_scope != "layers":
            return
        plugin = getattr(self.accelerator.state, "dynamo_plugin", None)
        if plugin is None or not hasattr(plugin, "use_regional_compilation"):
            raise SparseBertError("train.torch_compile_scope=layers needs an Accelerate with regional compilation "
                                  "(TorchDynamoPlugin.use_regional_compilation); upgrade accelerate or use model")
        plugin.use_regional_compilation = True
