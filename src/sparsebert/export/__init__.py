"""Exporting finished runs: plain model directories (labels, a model card, optionally ONNX) and compressed (bitmask
+ values) sparse ones; and 2:4 masked Linears for inference, to torch's semi-structured (cuSPARSELt) tensors or our
own sm90 CUTLASS kernel. Both turn a trained sparse model into its deployed form, so they live here, not in the
training core ``sparsity/``.
"""

from sparsebert.export.bitmask_loader import decompress_tensors, unpack_bits
from sparsebert.export.compressed import compress_state_dict, pack_bits
from sparsebert.export.model_dir import decompress_state_dict, export_run, load_compressed, resolve_run
from sparsebert.export.onnx import export_onnx
from sparsebert.export.semi_structured import (
    SemiStructuredLinear,
    feed_forward_names,
    is_two_four,
    to_semi_structured,
)
from sparsebert.export.sparse24_kernel import Sparse24Linear, to_sparse24_kernel

__all__ = ["SemiStructuredLinear", "Sparse24Linear", "compress_state_dict", "decompress_state_dict",
           "decompress_tensors", "export_onnx", "export_run", "feed_forward_names", "is_two_four", "load_compressed", "pack_bits",
           "resolve_run", "to_semi_structured", "to_sparse24_kernel", "unpack_bits"]
