"""Every private name of torch, Transformers, tokenizers, datasets and optuna that sparsebert touches, and nowhere
else (tests/upstream/test_only_here.py checks that no other module names one).

Private names change without notice between releases. Kept here, each is named once, with why it is needed, and
tests/upstream/ checks that each still exists, so an upgrade that renames one fails there, by name, instead of
somewhere inside a training run.

- ``torch_ops``: torch's (foreach kernels, cuSPARSELt, Dynamo / Inductor settings); imports torch only, so the
  sparsity core (plain PyTorch) may use it.
- ``transformers_trainer``: the Transformers Trainer's and TrainingArguments' (imports ``transformers.Trainer``).
- ``libraries``: a model config's, tokenizers', datasets' and optuna's attributes; imports nothing, so modules
  that load those libraries lazily stay lazy.

This file imports none of them: importing ``torch_ops`` must not import Transformers.
"""
