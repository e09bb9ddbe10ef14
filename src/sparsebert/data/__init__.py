"""Data: corpora and the cached featurizer; one module per task for reading, featurizing and post-processing (its
metrics and output writers are in ``jobs/finetune/<task>.py``)."""
