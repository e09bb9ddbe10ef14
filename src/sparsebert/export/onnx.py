"""``run.py --export RUN --to DIR --onnx``: the exported model as ``model.onnx`` too, checked against PyTorch.

The graph is written by ``torch.onnx.export``'s TorchScript exporter: ``optimum-onnx`` (0.1.0, the newest) pins
``transformers<4.58`` and would downgrade our transformers 5; torch's dynamo exporter gives the same graph here but
is the slower of the two. Inputs are the tokenizer's (``input_ids``, ``attention_mask``,
``token_type_ids``), batch and sequence dynamic; outputs are the model's logits under their transformers names.

The export is not kept unless ONNX Runtime (CPU) reproduces PyTorch on real tokenized text, at another batch and
sequence length than the traced one and with padding: the largest absolute difference of any output must be at
most ``TOLERANCE``; otherwise the command fails naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from sparsebert.errors import SparseBertError

log = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
TOLERANCE = 1e-4
OPSET = 18
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model")
# model class -> its outputs, in the order the graph returns them
OUTPUTS = {"BertForSequenceClassification": ("logits",), "BertForMaskedLM": ("logits",),
           "BertForQuestionAnswering": ("start_logits", "end_logits")}
# real sentences of different lengths (SST-2 dev rows): the check pads them to one batch
SAMPLE_TEXTS = (
    "it 's a charming and often affecting journey . ",
    "unflinchingly bleak and desperate ",
    "allows us to hope that nolan is poised to embark a major career as a commercial yet inventive filmmaker . ",
    "the acting , costumes , music , cinematography and sound are all astounding given the production 's "
    "austere locales . ",
)


class _Outputs(torch.nn.Module):
    """The model with positional tensor inputs and a tuple of named outputs: what the exporter traces."""

    def __init__(self, model: torch.nn.Module, outputs: Sequence[str]) -> None:
        super().__init__()
        self.model, self.outputs = model, tuple(outputs)

    def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN201 (traced)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[name] for name in self.outputs)


def require_onnx() -> None:
    """Refuse ``--onnx`` at once where its packages are missing (before any export work)."""
    import importlib.util

    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise SparseBertError(f"--onnx needs {' and '.join(missing)}: pip install 'sparsebert[onnx]'")


def export_onnx(model_dir: Path, texts: Sequence[str] = SAMPLE_TEXTS) -> float:
    """Write ``model_dir/model.onnx`` from the model ``from_pretrained(model_dir)`` loads, and check it.

    Args:
        model_dir: an export's directory (config, weights, tokenizer).
        texts: the check's inputs, tokenized by the directory's tokenizer (two or more).
    Returns:
        the largest absolute difference between ONNX Runtime's outputs and PyTorch's (at most ``TOLERANCE``).
    Raises:
        SparseBertError: no tokenizer, a model class without an ONNX recipe, or outputs that differ.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    arch = (config.architectures or [None])[0]
    if arch not in OUTPUTS:
        raise SparseBertError(f"--onnx: no ONNX export for {arch} (supported: {', '.join(OUTPUTS)})")
    # transformers 5 makes an empty tokenizer (special tokens only) for a directory without one: look for its files
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        raise SparseBertError("--onnx: the run's model/ has no tokenizer to make the check's inputs (none of "
                              f"{', '.join(TOKENIZER_FILES)})")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    # eager attention: the masked softmax traces into plain ONNX ops
    model = getattr(transformers, arch).from_pretrained(model_dir, attn_implementation="eager").eval()
    wrapper = _Outputs(model, OUTPUTS[arch]).eval()
    check = {k: v for k, v in tokenizer(list(texts), padding=True, return_tensors="pt").items() if k in INPUTS}
    if "token_type_ids" not in check:
        check["token_type_ids"] = torch.zeros_like(check["input_ids"])
    # the reference first: the exporter leaves the module in training mode (dropout on)
    with torch.no_grad():
        reference = [t.numpy() for t in wrapper(*(check[k] for k in INPUTS))]
    traced = {k: v[:1, : max(2, int(check["attention_mask"][0].sum()))] for k, v in check.items()}
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    with torch.no_grad():
        torch.onnx.export(wrapper, tuple(traced[k] for k in INPUTS), str(model_dir / ONNX_FILE),
                          input_names=list(INPUTS), output_names=list(OUTPUTS[arch]), opset_version=OPSET,
                          dynamic_axes=dynamic, dynamo=False)
    model.eval()
    return parity(model_dir / ONNX_FILE, check, reference)


def parity(onnx_file: Path, inputs: dict[str, torch.Tensor], reference: Sequence[np.ndarray],
           tolerance: float | None = None) -> float:
    """The largest absolute difference between ONNX Runtime's CPU outputs for ``inputs`` and ``reference``
    (``tolerance``: default ``TOLERANCE``).

    Raises:
        SparseBertError: above ``tolerance`` (or a NaN anywhere), naming the difference.
    """
    import onnxruntime

    tolerance = TOLERANCE if tolerance is None else tolerance
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    diff = max(float(np.max(np.abs(o - r))) for o, r in zip(outputs, reference, strict=True))
    if not diff <= tolerance:  # NaN fails too
        raise SparseBertError(f"--onnx: ONNX Runtime differs from PyTorch by {diff:.3g} (allowed {tolerance:g}) "
                              f"on {len(inputs['input_ids'])} tokenized rows; the export was not kept")
    log.info("ONNX Runtime matches PyTorch: max abs diff %.3g on %d rows", diff, len(inputs["input_ids"]))
    return diff
