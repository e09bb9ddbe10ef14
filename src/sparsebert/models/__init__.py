"""Models: BERT from named sizes or checkpoints, and task heads."""
