"""Finetuning: ``job.py`` runs every task of an experiment (``FinetuneJob``); ``common.py`` holds what the tasks
share; ``glue.py``, ``squad.py``, ``gap.py`` and ``csv_task.py`` are each task's loading, training, metrics and
writers. Prediction on a file given later lives in ``sparsebert.predict``."""
