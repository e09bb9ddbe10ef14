"""Exporting finished runs: plain model directories and compressed (bitmask + values) sparse ones."""

from sparsebert.export.compressed import compress_state_dict, decompress_tensors, pack_bits, unpack_bits
from sparsebert.export.model_dir import decompress_state_dict, export_run, load_compressed, resolve_run

__all__ = ["compress_state_dict", "decompress_state_dict", "decompress_tensors", "export_run", "load_compressed",
           "pack_bits", "resolve_run", "unpack_bits"]
