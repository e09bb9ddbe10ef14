"""A finished finetuning run as ``--predict`` opens it, and every check of the run, the input and the output
that happens before the model loads (2:4 kernel checks included)."""



from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparsebert.config import PRETRAINING_TASKS, from_dict
from sparsebert.config.sections import CsvTaskConfig, FinetuneConfig, TrainConfig
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.errors import SparseBertError
from sparsebert.io import unwritable_reason
from sparsebert.sparsity.config import SparsityConfig

log = logging.getLogger(__name__)


# the tasks --predict serves (predict/tasks.py: PREDICTORS), each with its output file's extension
EXTENSIONS = {"glue": "tsv", "csv": "csv", "squad_v1": "json", "squad_v2": "json", "gap": "csv"}
# the files each task writes beside its predictions file, ``<stem>_<suffix>`` (see sibling), in the order its
# predictor writes them; output_paths lists them for both the check before the model runs and the writers
COMPANIONS = {"glue": (), "csv": (), "squad_v1": ("nbest_predictions.json",),
              "squad_v2": ("nbest_predictions.json", "null_odds.json"), "gap": ("gap_system.tsv",)}


@dataclass
class FinishedRun:
    """A finished finetuning run directory and what its config.json says about it."""

    path: Path
    config: dict[str, Any]
    kind: str  # a key of PREDICTORS
    glue_task: str | None  # "rte" for a run of task glue:rte
    sparse24_kernel: bool = False  # run the sparse encoder Linears through the 2:4 kernel (prepare)
    long_rows: str = "truncate"  # GAP rows whose mentions do not fit one window (predict_gap)
    kernel_layers: list[str] | None = None  # what prepare converted

    @property
    def finetune(self) -> FinetuneConfig:
        return from_dict(FinetuneConfig, self.config.get("finetune", {}), prefix="finetune")

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def model_config_source(self) -> str:
        """Where the model's transformers config is: its model/ directory, or for a GAP run, whose model/ holds the
        weights only, the encoder the run started from (``model_source``, as load_gap_model reads it)."""
        if self.kind == "gap":
            return str(self.config.get("model_source", ""))
        return str(self.model_dir)

    @property
    def eval_batch_size(self) -> int:
        return int(self.config.get("train", {}).get("eval_batch_size", 128))

    def tokenizer(self):
        return load_tokenizer(str(self.model_dir))  # the runner saves the tokenizer beside the model

    def prepare(self, model: nn.Module) -> nn.Module:
        """The loaded model as predictions run it: as it is, or with ``--sparse24-kernel`` in bf16 on the GPU with
        its sparse Linears converted to the 2:4 kernel (their names kept in ``kernel_layers``)."""
        if not self.sparse24_kernel:
            return model
        model = model.to(device="cuda", dtype=torch.bfloat16).eval()
        self.kernel_layers = convert_to_sparse24(self, model)
        return model


def open_run(run: str | Path, output_root: Path) -> FinishedRun:
    """The finished finetuning run ``run`` names: a run directory, or its path under ``output_root``."""
    candidates = [Path(run)] + ([output_root / run] if not Path(run).is_absolute() else [])
    path = next((p for p in candidates if p.is_dir()), None)
    if path is None:
        raise SparseBertError(f"--predict {run}: no run directory {run}" + (
            f" (nor {output_root / run})" if len(candidates) > 1 else ""))
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if not (path / "DONE").is_file():
        raise SparseBertError(f"--predict: run {path} has not finished (no DONE marker)")
    if not isinstance(config, dict) or "task" not in config:
        raise SparseBertError(f"--predict: {path} is not a finetuning run (no config.json with a task)")
    task = str(config["task"])
    kind, _, name = task.partition(":")
    if task in PRETRAINING_TASKS:
        raise SparseBertError(f"--predict: {path} is a pretraining run, not a finetuning run")
    if "experiment" not in config:  # finish_run adds it to a run's config; an experiment's own lacks it
        raise SparseBertError(f"--predict: {path} is an experiment directory; name one of its runs "
                              "(e.g. <experiment>/glue_rte/run0, <experiment>/gap/run0)")
    if kind not in EXTENSIONS:
        raise SparseBertError(f"--predict: run {path} is of task {task}, which has no predict "
                              f"(tasks with one: {', '.join(sorted(EXTENSIONS))})")
    if not (path / "model" / "model.safetensors").is_file():
        raise SparseBertError(f"--predict: run {path} exported no model (finetune.save_model=false?)")
    return FinishedRun(path, config, kind, name or None)


def default_output(run: FinishedRun, input_file: Path) -> Path:
    """``<run>/predict/<input stem>.<the task's extension>``."""
    return run.path / "predict" / f"{input_file.stem}.{EXTENSIONS[run.kind]}"


def sibling(output: Path, suffix: str) -> Path:
    """A second output beside ``output``: ``<stem>_<suffix>``, e.g. dev_nbest_predictions.json."""
    return output.with_name(f"{output.stem}_{suffix}")


def output_paths(run: FinishedRun, output: Path) -> list[Path]:
    """Every file a prediction of ``run`` writes: ``output`` first, then its task's COMPANIONS beside it."""
    return [output, *(sibling(output, suffix) for suffix in COMPANIONS[run.kind])]


KERNEL_HINT = "predict without --sparse24-kernel"


def check_two_four_run(run: FinishedRun) -> None:
    """``--sparse24-kernel`` needs a run trained with ``sparsity.pattern`` "2:4"."""
    sparsity = run.config.get("sparsity")
    if not isinstance(sparsity, dict):
        raise SparseBertError(f"--sparse24-kernel: run {run.path} is dense (no sparsity section); the kernel runs "
                              f"2:4 runs only (sparsity.pattern \"2:4\", e.g. tiny_glue_2to4); {KERNEL_HINT}")
    pattern = sparsity.get("pattern", "unstructured")
    if pattern != "2:4":
        raise SparseBertError(f"--sparse24-kernel: run {run.path} has sparsity.pattern {pattern!r}, not \"2:4\"; "
                              f"the kernel runs 2:4 runs only (e.g. tiny_glue_2to4); {KERNEL_HINT}")


def check_sparse24_device() -> None:
    """An sm90 GPU and the built kernel library, or the one-line error that says which is missing."""
    from sparsebert.export.sparse24_kernel import Library, Sparse24Error

    if not torch.cuda.is_available():
        raise SparseBertError("--sparse24-kernel needs an sm90 GPU (H100/H200); this machine has no CUDA device; "
                              + KERNEL_HINT)
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        raise SparseBertError(f"--sparse24-kernel needs an sm90 GPU (H100/H200); {torch.cuda.get_device_name()} "
                              f"is sm{capability[0]}{capability[1]}; {KERNEL_HINT}")
    try:
        Library.get()
    except Sparse24Error as e:  # not built, or built from another sparse24.cu
        raise SparseBertError(f"--sparse24-kernel: {' '.join(str(e).split())}") from None


def convert_to_sparse24(run: FinishedRun, model: nn.Module) -> list[str]:
    """Convert the run's sparse Linears (its ``sparsity`` selection) of ``model`` (bf16, on the GPU) to the 2:4
    kernel; every one must be 2:4 with dimensions the kernel takes. Returns the converted names."""
    from sparsebert.export import is_two_four, to_sparse24_kernel
    from sparsebert.export.sparse24_kernel import ALIGNMENT, Sparse24Error
    from sparsebert.sparsity.selection import select_parameters

    try:
        selected = select_parameters(model, from_dict(SparsityConfig, run.config["sparsity"], prefix="sparsity"))
    except ValueError as e:
        raise SparseBertError(f"--sparse24-kernel: run {run.path}: {e}") from None
    names = []
    for param_name, weight in selected.items():
        name = param_name.removesuffix(".weight")
        layer = model.get_submodule(name) if name != param_name else None
        if type(layer) is not nn.Linear:
            raise SparseBertError(f"--sparse24-kernel: {param_name} of run {run.path} is not an nn.Linear weight; "
                                  f"the kernel replaces Linears only; {KERNEL_HINT}")
        if layer.in_features % ALIGNMENT or layer.out_features % ALIGNMENT:
            raise SparseBertError(f"--sparse24-kernel: {name} of run {run.path} is {layer.out_features}x"
                                  f"{layer.in_features}; the kernel needs both multiples of {ALIGNMENT}; {KERNEL_HINT}")
        if not is_two_four(weight.detach()):
            raise SparseBertError(f"--sparse24-kernel: {name} of run {run.path} is not 2:4 (a group of four weights "
                                  f"holds more than 2 non-zeros); {KERNEL_HINT}")
        names.append(name)
    rows = (run.eval_batch_size * run.finetune.max_seq_length,)  # a full evaluation batch picks the tiles
    try:
        return to_sparse24_kernel(model, rows=rows, names=names)
    except (Sparse24Error, ValueError) as e:
        raise SparseBertError(f"--sparse24-kernel: {' '.join(str(e).split())}") from None


# what --set may change for a prediction: how the input is read and featurized, and the batch size; the rest of
# the config is how the run trained (its model, head and labels), which a prediction must keep


PREDICT_KEYS = ("csv.", "finetune.max_seq_length", "finetune.pad_to_multiple_of", "finetune.doc_stride",
                "finetune.max_query_length", "finetune.n_best_size", "finetune.max_answer_length",
                "finetune.null_score_diff_threshold", "train.eval_batch_size")
# the config section of each PREDICT_KEYS prefix, whose validate method checks the values --set gives it
PREDICT_SECTIONS = {"csv": CsvTaskConfig, "finetune": FinetuneConfig, "train": TrainConfig}


def with_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The run's config.json with ``--set key=value`` items applied (each key one of ``PREDICT_KEYS``), checked
    against the experiment schema and, as the registry checks an experiment, by the validate method of each
    section a key changed (train.eval_batch_size=0 is refused here, not by the DataLoader after featurizing)."""
    from sparsebert.config import ConfigError
    from sparsebert.config.experiment_registry import apply_override

    config = copy.deepcopy(config)
    changed = set()
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in PREDICT_KEYS):
            raise ConfigError(f"--set {key}: --predict takes only csv.*, {', '.join(PREDICT_KEYS[1:])} (the rest "
                              "is how the run trained)")
        apply_override(config, item)
        changed.add(key.partition(".")[0])
    for section in sorted(changed):
        from_dict(PREDICT_SECTIONS[section], config.get(section) or {}, prefix=section)  # runs its validate
    return config


def apply_overrides(run: FinishedRun, overrides: Sequence[str]) -> None:
    """Give ``run`` its config with ``overrides`` (:func:`with_overrides`). A finetune.max_seq_length raised above
    the trained one (which fit) is checked against the model's position embeddings as training checks it, before
    the model loads: a longer input would fail in the forward pass."""
    from sparsebert.jobs.finetune.job import check_positions

    trained_length = run.finetune.max_seq_length
    run.config = with_overrides(run.config, overrides)
    if run.finetune.max_seq_length > trained_length:
        check_positions(run.model_config_source, run.finetune.max_seq_length)


def check_readable(input_file: Path) -> None:
    """``--input`` names a file this process can read."""
    if input_file.is_dir():
        raise SparseBertError(f"--input {input_file}: is a directory; name the file to predict on")
    if not input_file.is_file():
        raise SparseBertError(f"--input {input_file}: no such file")
    try:
        with open(input_file, "rb"):
            pass
    except OSError as e:
        raise SparseBertError(f"--input {input_file}: cannot read it: {e.strerror}") from None


# a larger file that starts like JSON is not parsed to find out (it would be read twice)
JSON_CHECK_BYTES = 64 * 2**20
# what each task predicts on, for the error when --input is another task's file
INPUT_FORMATS = {"glue": "a GLUE TSV in the task's layout", "csv": "a CSV/TSV of rows", "gap": "a GAP TSV",
                 "squad_v1": "a SQuAD JSON", "squad_v2": "a SQuAD JSON"}


def check_input_format(run: FinishedRun, input_file: Path) -> None:
    """``--input`` is JSON exactly where the run's task reads JSON (SQuAD): another task's file is named as such,
    not left to a reader that trips over it (a SQuAD JSON read as TSV is one 'field larger than the field limit',
    a TSV read as JSON 'truncated or corrupt'). What this cannot tell (an empty file, one that is not UTF-8 text,
    one too large to parse twice) is left to the task's reader and its errors."""
    with open(input_file, "rb") as f:
        head = f.read(4096)
    if len(head) == 4096:  # a character the block cuts in two is not a decoding error
        head = head[:-3]
    try:
        start = head.removeprefix(b"\xef\xbb\xbf").decode("utf-8").lstrip()[:1]
    except UnicodeDecodeError:
        return
    if not start:
        return
    task, wants = run.config["task"], INPUT_FORMATS[run.kind]
    if run.kind.startswith("squad"):
        if start != "{":
            raise SparseBertError(f"--input {input_file}: not JSON; run {run.path} (task {task}) predicts on {wants}")
        return
    # a CSV row may start with a bracket too: only a whole JSON document is refused
    if start in "{[" and input_file.stat().st_size <= JSON_CHECK_BYTES:
        try:
            with open(input_file, encoding="utf-8-sig") as f:
                json.load(f)
        except (ValueError, RecursionError):
            return
        raise SparseBertError(f"--input {input_file}: a JSON file; run {run.path} (task {task}) predicts on {wants}")


def check_output(output: Path | None, run: FinishedRun, input_file: Path) -> list[Path]:
    """Every file the prediction writes (:func:`output_paths` of ``--output`` or the run's default), checked: a
    destination that cannot take one of them fails before the model loads and the input is featurized, not after
    the first file is written. Returns those paths, for the task's writers."""
    given = output is not None
    output = output if given else default_output(run, input_file)
    named = f"--output {output}" if given else f"the predictions file {output} (in the run's directory)"
    paths = output_paths(run, output)
    for path in paths:
        # a companion file is named with the output that places it: another --output is the fix for both
        subject, other = (named, "file") if path == output else (f"{path} (written beside {named})", "--output")
        if path.is_dir():
            raise SparseBertError(f"{subject} is a directory; name another {other}")
        if path.resolve() == input_file.resolve():
            raise SparseBertError(f"{subject} is the input file; name another {other}")
        if overwrites_run(path, run):
            raise SparseBertError(f"{subject} is inside the run directory {run.path}, whose files it would replace; "
                                  f"write under {run.path / 'predict'} (the default) or outside the run")
        problem = unwritable_reason(path)
        if problem is not None:
            raise SparseBertError(f"cannot write {subject}: {problem}; pass --output FILE in a writable directory")
    return paths


def overwrites_run(path: Path, run: FinishedRun) -> bool:
    """``path`` lies inside the run directory but not in its ``predict/`` folder (where predictions go by default):
    a prediction written there would replace, or sit among, the files the run wrote (config.json, model/, ...).
    Symlinks and relative parts are resolved, so no other spelling of the run's files gets past."""
    resolved = path.resolve()
    return run.path.resolve() in resolved.parents and (run.path / "predict").resolve() not in resolved.parents
