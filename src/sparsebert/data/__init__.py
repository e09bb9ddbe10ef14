"""Data: one module per task (reading, featurizing, metrics, post-processing)."""
