"""Results layer: the run registry (one SQLite file per output root), the tables and plots built from it, and run
lookup (``runs``: a run name -> the model it exported)."""

from sparsebert.results.glue_table import glue_table
from sparsebert.results.registry import REGISTRY_FILENAME, Registry, RunRecord

__all__ = ["REGISTRY_FILENAME", "Registry", "RunRecord", "glue_table"]
