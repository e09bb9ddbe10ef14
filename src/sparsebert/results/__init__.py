"""Results layer: the run registry (one SQLite file per output root) and the tables built from it."""

from sparsebert.results.glue_table import glue_table
from sparsebert.results.registry import REGISTRY_FILENAME, Registry, RunRecord

__all__ = ["REGISTRY_FILENAME", "Registry", "RunRecord", "glue_table"]
