"""The jobs ``run.py`` runs, one per kind of experiment (``runner.py`` picks it by the experiment's task):

- ``pretrain.py``: MLM pretraining (``PretrainJob``);
- ``upstream_pruning.py``: task ``upstream``, pruning a pretrained encoder on the corpus while it distils its dense
  self (``UpstreamPruningJob``);
- ``finetune/``: finetuning (``FinetuneJob`` in ``finetune/job.py``), each task's data, metrics and writers in a
  module of its own.

Each job builds its Trainer from ``sparsebert.trainer`` (the training step, the hooks) and never the other way.
"""
