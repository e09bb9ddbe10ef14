"""``python run.py --export RUN --to DIR [--compressed] [--onnx]``: a finished run's model as a directory of its own.

The plain export is the run's ``model/`` directory (config, tokenizer files, ``model.safetensors``) without the
Trainer's pickled ``training_args.bin``, plus a model card (``README.md``, :mod:`sparsebert.export.model_card`):
``from_pretrained(DIR)`` loads it, and its config names the task's labels (``id2label``), so that a ``pipeline``
answers ``positive``, not ``LABEL_1``. Every file is published with the umask's permissions (0644), whatever the
library that wrote it chose (safetensors: 0600). ``--onnx`` adds ``model.onnx``, checked against PyTorch
(:mod:`sparsebert.export.onnx`). The export's ``config.json`` names a class that loads the weights:
transformers' ``BertForMaskedLM`` for a pretraining run (whose class, our MLM fast path, holds the same weights);
a GAP run, whose ``model/`` holds only the state dict, gets the encoder's config naming
``GapClassifier`` and its head (:func:`sparsebert.models.gap_heads.exported_config`). The compressed export replaces
the weight files by ``model.compressed.safetensors`` (:mod:`sparsebert.export.compressed`), adds
``compression.json``, and keeps config, tokenizer and the card (which names the loader); since it holds no
``model.safetensors``, ``from_pretrained`` refuses it (it finds no weights) instead of loading random ones, and
:func:`load_compressed` loads it.

The directory appears whole or not at all: it is written into a temporary directory beside ``DIR`` and renamed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from sparsebert.errors import SparseBertError
from sparsebert.export import bitmask_loader
from sparsebert.export.bitmask_loader import AUTO_MAP, FORMAT, WEIGHTS_NAME
from sparsebert.export.compressed import read_compressed, save_compressed
from sparsebert.export.model_card import label_names, model_card, set_labels
from sparsebert.io import atomic_dir, atomic_write_json, atomic_write_text
from sparsebert.models.ties import loaded_through_a_tie

COMPRESSION_FILE = "compression.json"
# our model classes -> the transformers class an exported config names in their place: the same weights and outputs
# (BertForMaskedLMAtMasked computes the decoder at masked rows only, while it trains)
TRANSFORMERS_CLASSES = {"BertForMaskedLMAtMasked": "BertForMaskedLM"}
SKIPPED = {"training_args.bin"}  # a pickle of the Trainer's arguments: not part of the model, unsafe to load
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
USAGE = """## Use

```python
{load}```
"""
TRANSFORMERS_LOAD = """from transformers import {architecture}
model = {architecture}.from_pretrained("{name}")
"""
PIPELINE_LOAD = """from transformers import pipeline
classify = pipeline("text-classification", model="{name}")
classify("a charming and often affecting journey")  # [{{'label': ..., 'score': ...}}]
"""
GAP_LOAD = """from sparsebert.jobs.finetune.gap import load_gap_model
model = load_gap_model("{name}", "{head}", "{name}")  # the GAP head takes span indices: no pipeline
"""
COMPRESSED_USAGE = """## Use

The weights are in `{weights}`: each mostly-zero tensor as a bitmask and its non-zero values ({format}),
read by `bitmask_loader.py` beside them (transformers 5 and compressed-tensors dropped the sparse-bitmask format
transformers once loaded by itself). Load the model, bit for bit, with

```python
{load}
```

{compressed} of {tensors} tensors compressed: weights {dense_mb:.2f} MB -> {packed_mb:.2f} MB; the whole directory
{plain_dir_mb:.2f} MB -> {dir_mb:.2f} MB ({against_plain}).
"""


def against_plain_export(plain_bytes: int, dir_bytes: int) -> str:
    """How a compressed export's directory compares with the plain export's: ``2.31x smaller than the plain
    export``, or, where nothing compressed enough to pay for the bitmasks and loader, ``not smaller than ...``."""
    if dir_bytes < plain_bytes:
        return f"{plain_bytes / dir_bytes:.2f}x smaller than the plain export"
    return f"not smaller than the plain export ({dir_bytes - plain_bytes:+,} bytes)"


def resolve_run(run: str, root: Path) -> Path:
    """The finished run named by ``run``: a directory holding ``model/``, or such a path under the output root.

    Raises SparseBertError (one line) for an unknown or unfinished run, or a run that saved no model.
    """
    candidates = [Path(run), root / run]
    found = next((p for p in candidates if (p / "model").is_dir()), None)
    if found is None:
        found = next((p for p in candidates if p.is_dir()), None)
        if found is None:
            raise SparseBertError(f"--export {run}: no such run (looked in . and {root})")
        runs = sorted(p.parent.relative_to(found).as_posix() for p in found.glob("*/run*/model"))
        if runs:  # a finetuning experiment: its models are per task and run
            raise SparseBertError(f"--export {run} is an experiment with several runs; name one, e.g. "
                                  f"{Path(run) / runs[0]}")
    if not (found / "DONE").is_file():  # stopped (killed, terminated, failed) or still training
        raise SparseBertError(f"--export {run}: {found} {why_unfinished(found, root)}; finish it with --resume "
                              "(the command that started it, plus --resume), then export it")
    if not (found / "model").is_dir():
        raise SparseBertError(f"--export {run}: {found} finished without saving its model (finetune.save_model "
                              "off?)")
    return found


def why_unfinished(run_dir: Path, root: Path) -> str:
    """What the results registry says about a run without ``DONE``: failed with its error (``terminated by
    SIGTERM``), or running (still training, or killed); "has not finished" where no registry has it."""
    from sparsebert.results.recording import find_run_record

    # the output root's registry, or the one of the output root the run lies in (a run named by its path)
    record = find_run_record(run_dir, [root])
    if record is not None and record.status == "failed":
        return f"did not finish: {record.error or 'it failed'}"
    if record is not None and record.status == "running":
        return "has not finished: the registry has it running (still training, or killed)"
    return "has not finished (no DONE file)"


def export_run(run: str, root: Path, to: Path, compressed: bool, onnx: bool = False) -> dict[str, Any]:
    """Export the finished run ``run`` to the new directory ``to``; returns a summary (sizes, tensor counts, the
    ONNX check's difference)."""
    if onnx and compressed:
        raise SparseBertError("--onnx goes with the plain export (its weights are dense), not --compressed")
    if onnx:
        from sparsebert.export.onnx import require_onnx

        require_onnx()
    run_dir = resolve_run(run, root)
    with atomic_dir(to, f"--to {to}") as tmp:
        summary = _write(run_dir / "model", tmp, compressed, run_dir, to.name)
        if onnx:
            from sparsebert.export.onnx import export_onnx

            summary["onnx_max_abs_diff"] = export_onnx(tmp)
            summary["dir_bytes"] = _dir_bytes(tmp)
    return summary


def _write(model_dir: Path, out: Path, compressed: bool, run_dir: Path, name: str) -> dict[str, Any]:
    weights = [p for p in model_dir.iterdir() if p.name in WEIGHT_FILES or _is_shard(p)]
    for p in model_dir.iterdir():
        if p.name in SKIPPED or (compressed and p in weights):
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, out / p.name)
    has_config = (model_dir / "config.json").is_file()
    state = read_weights(model_dir) if compressed or not has_config else None
    config = write_loadable_config(model_dir, run_dir, out, state)
    # the task's labels, or the names the run saved (a CSV run without them in metrics.json); not LABEL_0, ...
    id2label = [str(n) for n in (config.get("id2label") or {}).values()]
    named = id2label == label_names(_run_config(run_dir).get("task"), run_dir)
    labels = id2label if id2label and (named or not all(re.fullmatch(r"LABEL_\d+", n) for n in id2label)) \
        else None
    architecture = (config.get("architectures") or [None])[0]
    plain_card = model_card(run_dir, labels, architecture, USAGE.format(load=_load_code(name, config, labels)))
    dense_bytes = sum(p.stat().st_size for p in weights if p.suffix == ".safetensors")
    summary: dict[str, Any] = {"run": str(run_dir), "compressed": compressed, "dense_bytes": dense_bytes}
    if not compressed:
        atomic_write_text(out / "README.md", plain_card)
        summary["dir_bytes"] = _dir_bytes(out)
        return summary
    shapes = save_compressed(state, out / WEIGHTS_NAME)
    packed_bytes = (out / WEIGHTS_NAME).stat().st_size
    # the plain export of the same run: the files both share (config, tokenizer), its card and dense weights
    readme = out / "README.md"  # a card the run's model/ holds is replaced by ours
    shared = _dir_bytes(out) - packed_bytes - (readme.stat().st_size if readme.is_file() else 0)
    summary.update({"format": FORMAT, "weights": WEIGHTS_NAME, "tensors": len(state),
                    "compressed_tensors": sorted(shapes), "packed_bytes": packed_bytes,
                    "plain_dir_bytes": shared + len(plain_card.encode()) + dense_bytes})
    load = _compressed_load_code(name, out, architecture)  # after the sizes the plain export shares
    # the card and compression.json name the directory's size, which they are part of: written until the size
    # they name is theirs (a digit more or less in a number changes it; twice or three times suffices)
    summary["dir_bytes"] = 0
    for _ in range(5):
        if summary["dir_bytes"] == _dir_bytes(out):
            break
        summary["dir_bytes"] = _dir_bytes(out)
        atomic_write_text(out / "README.md", model_card(run_dir, labels, architecture, COMPRESSED_USAGE.format(
            weights=WEIGHTS_NAME, format=FORMAT, load=load, compressed=len(shapes), tensors=len(state),
            dense_mb=dense_bytes / 1e6, packed_mb=packed_bytes / 1e6, plain_dir_mb=summary["plain_dir_bytes"] / 1e6,
            dir_mb=summary["dir_bytes"] / 1e6,
            against_plain=against_plain_export(summary["plain_dir_bytes"], summary["dir_bytes"]))))
        atomic_write_json(out / COMPRESSION_FILE, summary)
    return summary


def _compressed_load_code(name: str, out: Path, architecture: str | None) -> str:
    """Ship the format's reader with a compressed export and map the Auto class to it in ``config.json``, so that
    ``from_pretrained(..., trust_remote_code=True)`` loads it without sparsebert; the card's load code."""
    if architecture not in AUTO_MAP:  # a GAP model: its head is ours
        return f'from sparsebert.export import load_compressed\nmodel = load_compressed("{name}")'
    shutil.copy2(bitmask_loader.__file__, out / "bitmask_loader.py")
    auto_class, loader = AUTO_MAP[architecture]
    config = json.loads((out / "config.json").read_text())
    config["auto_map"] = {auto_class: f"bitmask_loader.{loader}"}
    atomic_write_json(out / "config.json", config)
    return (f"from transformers import {auto_class}\n"
            f'model = {auto_class}.from_pretrained("{name}", trust_remote_code=True)  # or sparsebert\'s '
            "load_compressed")


def _load_code(name: str, config: dict[str, Any], labels: list[str] | None) -> str:
    """How the card says to load the plain export ``name``: its class, and a pipeline where it has labels."""
    architecture = (config.get("architectures") or [None])[0]
    if architecture == "GapClassifier":
        return GAP_LOAD.format(name=name, head=config.get("gap_head"))
    code = TRANSFORMERS_LOAD.format(name=name, architecture=architecture or "AutoModel")
    return code + PIPELINE_LOAD.format(name=name) if labels else code


def _dir_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def write_loadable_config(model_dir: Path, run_dir: Path, out: Path,
                          state: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """``out/config.json``, naming a class that loads the weights (see the module docstring) and the task's labels.

    Args:
        model_dir, run_dir, out: the run's ``model/``, the run, the export being written.
        state: the weights, needed where ``model/`` has no config (a GAP run: the layer count comes from them).
    Returns:
        the config written ({} where nothing says what the weights are: none is written).
    """
    run = _run_config(run_dir)
    if (model_dir / "config.json").is_file():
        config = json.loads((model_dir / "config.json").read_text())
        config["architectures"] = [TRANSFORMERS_CLASSES.get(a, a) for a in config.get("architectures") or []]
    elif run.get("task") == "gap" and state is not None:
        from sparsebert.models.gap_heads import exported_config

        head = run.get("finetune", {}).get("gap_head")
        config = exported_config(state, str(run.get("model_source")), head).to_dict()
    else:
        return {}  # nothing says what the weights are
    # runs saved before their config named the task's labels (LABEL_0, LABEL_1) get them here
    # GapClassifier's head is its own (three classes): the encoder config's num_labels does not size it
    config = set_labels(config, label_names(run.get("task"), run_dir), check_size=run.get("task") != "gap")
    atomic_write_json(out / "config.json", config)
    return config


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's own config.json ({} if unreadable: the export then keeps the model directory as it is)."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _is_shard(p: Path) -> bool:
    return p.name.startswith("model-") and p.suffix == ".safetensors"


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``save_pretrained`` directory (one file or shards named by the index)."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        raise SparseBertError(f"{model_dir} holds no model.safetensors (nor a sharded index)")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        state.update(load_file(str(model_dir / shard)))
    return state


def decompress_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict of a compressed export, bit-exact to the run's saved weights.

    Args:
        directory: what ``run.py --export RUN --to DIR --compressed`` wrote.
    Returns:
        tensor name -> dense tensor, as in the run's ``model.safetensors``.
    """
    directory = Path(directory)
    if not (directory / COMPRESSION_FILE).is_file():
        raise SparseBertError(f"{directory} is not a compressed export (no {COMPRESSION_FILE})")
    return read_compressed(directory / WEIGHTS_NAME)


def load_compressed(directory: str | os.PathLike, model_class: type | None = None) -> torch.nn.Module:
    """A model loaded from a compressed export, its tensors bit-exact to the run's saved weights.

    Args:
        directory: what ``run.py --export RUN --to DIR --compressed`` wrote.
        model_class: a ``PreTrainedModel`` class or ``GapClassifier``; default: the class ``config.architectures``
            names first.
    Returns:
        the model in eval mode, on the CPU, in the dtype its weights were saved in.
    """
    import transformers

    from sparsebert.models.gap_heads import GapClassifier

    state = decompress_state_dict(directory)
    config = transformers.AutoConfig.from_pretrained(directory)
    model_class = model_class or named_class(directory, config)
    model = GapClassifier.from_config(config) if model_class is GapClassifier else model_class(config)
    # assign: the parameters become the stored tensors themselves (dtype included), not fp32 copies of them
    result = model.load_state_dict(state, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # tied weights (the MLM decoder's weight and bias) are stored once, under the other name
    untied = sorted(set(result.missing_keys) - loaded_through_a_tie(model, result.missing_keys))
    if untied or result.unexpected_keys:
        raise SparseBertError(f"{directory}: weights do not fit {model_class.__name__} (missing {untied[:3]}, "
                              f"unexpected {result.unexpected_keys[:3]})")
    return model.eval()


def named_class(directory: str | os.PathLike, config) -> type:
    """The class the first of ``config.architectures`` names: a transformers class (ours stand for the transformers
    class they extend, as in exports made before the config named it) or ``GapClassifier``."""
    import transformers

    from sparsebert.models.gap_heads import GapClassifier

    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch == GapClassifier.__name__:
        return GapClassifier
    model_class = getattr(transformers, TRANSFORMERS_CLASSES.get(arch, arch), None) if arch else None
    if model_class is None:
        raise SparseBertError(f"{directory}: config names no transformers architecture ({arch!r}); pass "
                              "model_class, or use decompress_state_dict")
    return model_class
