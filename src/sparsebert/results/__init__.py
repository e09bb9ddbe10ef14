"""Results layer: the run registry (one SQLite file per output root), the tables and plots built from it, and run
lookup (``runs``: a run name -> the model it exported)."""

from sparsebert.results.glue_table import glue_table
from sparsebert.results.run_registry import REGISTRY_FILENAME, RunRecord, RunRegistry

__all__ = ["REGISTRY_FILENAME", "RunRegistry", "RunRecord", "glue_table"]
