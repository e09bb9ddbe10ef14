"""Reading the bitmask + values format (``sparsebert-bitmask-v1``, written by :mod:`sparsebert.export.compressed`),
and loading a compressed export with ``from_pretrained``.

This module imports nothing from sparsebert: ``run.py --export --compressed`` copies it into the export, and the
export's ``config.json`` maps the Auto classes to the classes below (``auto_map``), so that

    AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True)

gives the run's model, bit for bit, where sparsebert is not installed (``DIR`` a local directory or a Hub repo
id). Each class is the plain transformers class
with its ``from_pretrained`` reading ``model.compressed.safetensors``; the model returned is of the plain class.
(The ``compressed-tensors`` sparse-bitmask format, which transformers once loaded without remote code, is gone from
both libraries: compressed-tensors PR #610, transformers PR #46342.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import (
    AutoConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from transformers.utils import cached_file

FORMAT = "sparsebert-bitmask-v1"
WEIGHTS_NAME = "model.compressed.safetensors"
MASK_SUFFIX = ".__mask__"
VALUES_SUFFIX = ".__values__"


def unpack_bits(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """The first ``numel`` flags of ``packed`` (8 per byte, most significant bit first) as a 1-D bool tensor."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    bits = (packed.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:numel].bool()


def decompress_tensors(tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, list[int]]) -> dict[str, torch.Tensor]:
    """The dense state dict from the stored tensors and the compressed ones' shapes (zeros as ``+0.0``).

    Raises:
        ValueError: a compressed tensor's part is missing, or its mask and values do not fit its shape.
    """
    out = {name: t for name, t in tensors.items() if not name.endswith((MASK_SUFFIX, VALUES_SUFFIX))}
    for name, shape in shapes.items():
        try:
            packed, values = tensors[name + MASK_SUFFIX], tensors[name + VALUES_SUFFIX]
        except KeyError as e:
            raise ValueError(f"compressed tensor {name}: its part {e.args[0]} is missing") from None
        numel = 1
        for size in shape:
            numel *= size
        flags = unpack_bits(packed, numel)
        if packed.numel() != (numel + 7) // 8 or int(flags.sum()) != values.numel():
            raise ValueError(f"compressed tensor {name}: mask and values do not match shape {shape}")
        dense = torch.zeros(numel, dtype=values.dtype)
        dense[flags] = values
        out[name] = dense.view(shape)
    return out


def read_bitmask_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The dense state dict stored in the ``sparsebert-bitmask-v1`` safetensors file ``path``.

    Raises:
        ValueError: the file is missing, not safetensors, or not of this format.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"{path} is not a safetensors file: {e}") from None
    if meta.get("sparsebert_format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file (metadata format {meta.get('sparsebert_format')!r})")
    return decompress_tensors(tensors, _shapes(meta, tensors, path))


def _shapes(meta: Mapping[str, str], tensors: Mapping[str, torch.Tensor], path: Path) -> dict[str, list[int]]:
    """The metadata's shapes of the compressed tensors: one list of sizes for each tensor stored as mask + values
    (a tensor without one would be left out of the state dict without a word)."""
    try:
        shapes = json.loads(meta["shapes"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}: its metadata has no readable 'shapes'") from None
    if not isinstance(shapes, dict) or not all(
            isinstance(s, list) and all(isinstance(n, int) and n >= 0 for n in s) for s in shapes.values()):
        raise ValueError(f"{path}: its metadata 'shapes' is not a mapping of tensor names to lists of sizes")
    stored = {name[: -len(MASK_SUFFIX)] for name in tensors if name.endswith(MASK_SUFFIX)}
    if stored - set(shapes):
        raise ValueError(f"{path}: no shape for the compressed tensor(s) {sorted(stored - set(shapes))[:3]}")
    return shapes


# from_pretrained's arguments that say where the files are (a local directory, or a Hub repo and its cache)
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
# what the Auto classes pass on to a remote-code class besides the user's own arguments
AUTO_KWARGS = ("trust_remote_code", "code_revision", "_commit_hash", "_from_auto")


class _FromBitmask:
    """``from_pretrained`` of a compressed export: the plain class (the next in the MRO) with the stored weights."""

    @classmethod
    def from_pretrained(cls, name_or_path, *args, config=None, dtype=None, torch_dtype=None, device_map=None,
                        **kwargs):
        """The model in ``name_or_path``, a local directory or a Hub repo id (``HUB_KWARGS`` as in transformers).
        ``dtype`` (or the older ``torch_dtype``) casts it, ``device_map`` moves it to one device; any other
        argument is refused rather than silently ignored."""
        hub = {k: kwargs.pop(k) for k in HUB_KWARGS if k in kwargs}
        for k in AUTO_KWARGS:
            kwargs.pop(k, None)
        if kwargs.get("adapter_kwargs", 0) is None:  # the Auto classes pass it, None without adapters
            kwargs.pop("adapter_kwargs")
        if args or kwargs:
            raise TypeError(f"the compressed export's from_pretrained takes no {sorted(kwargs) or 'positional'} "
                            "argument(s): load it without them, then change the model")
        if device_map is not None and not isinstance(device_map, str | int | torch.device):
            raise TypeError("the compressed export's from_pretrained takes device_map as one device (e.g. 'cuda:0'), "
                            "not a map of modules to devices")
        plain = next(c for c in cls.__mro__ if c.__module__.startswith("transformers."))  # the class it extends
        config = config if config is not None else AutoConfig.from_pretrained(name_or_path, **hub)
        model = plain(config)
        # the weights file from the directory, or from the Hub through transformers' cache like any model file
        state = read_bitmask_file(cached_file(name_or_path, WEIGHTS_NAME, **hub))
        # assign: the parameters become the stored tensors (their dtype too); tied weights (the MLM decoder's) are
        # stored once, under the other name
        result = model.load_state_dict(state, strict=False, assign=True)
        model.tie_weights()
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded = {params[name].data_ptr() for name in state if name in params}
        untied = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded]
        if untied or result.unexpected_keys:  # an error, never a re-initialised layer
            raise ValueError(f"{name_or_path}: weights do not fit {plain.__name__} (missing {untied[:3]}, "
                             f"unexpected {result.unexpected_keys[:3]})")
        dtype = dtype if dtype is not None else torch_dtype
        if dtype not in (None, "auto"):  # "auto": the stored dtype, which assign=True kept
            model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        if device_map is not None:
            model.to(device_map)
        return model.eval()


class BitmaskBertModel(_FromBitmask, BertModel):
    pass


class BitmaskBertForMaskedLM(_FromBitmask, BertForMaskedLM):
    pass


class BitmaskBertForSequenceClassification(_FromBitmask, BertForSequenceClassification):
    pass


class BitmaskBertForQuestionAnswering(_FromBitmask, BertForQuestionAnswering):
    pass


# architecture in config.json -> the Auto class and this module's class that loads it
AUTO_MAP = {
    "BertModel": ("AutoModel", "BitmaskBertModel"),
    "BertForMaskedLM": ("AutoModelForMaskedLM", "BitmaskBertForMaskedLM"),
    "BertForSequenceClassification": ("AutoModelForSequenceClassification", "BitmaskBertForSequenceClassification"),
    "BertForQuestionAnswering": ("AutoModelForQuestionAnswering", "BitmaskBertForQuestionAnswering"),
}
