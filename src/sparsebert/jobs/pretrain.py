"""The MLM pretraining job: data, model, hooks and Trainer for one experiment."""

from __future__ import annotations

import json
import logging
import math
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from safetensors import SafetensorError
from transformers import TrainerCallback

from sparsebert.config import ExperimentConfig
from sparsebert.data.mlm_data import MLMCollator, PretrainData, build_pretrain_data
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.distributed import process_state
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json, publish_tree
from sparsebert.models.bert import build_mlm_model, load_mlm_model, scatter_masked_predictions
from sparsebert.models.prepare import prepare_model
from sparsebert.results.runs import resolve_pretrained
from sparsebert.sparsity import SparsityController
from sparsebert.sparsity.persistence import MASKS_FILE, STATE_FILE
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.compile_watch import CompileWatch
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.totals import Totals, TrainingTotals
from sparsebert.trainer.trainer import SparseBertTrainer

log = logging.getLogger(__name__)

TRAINER_STATE_NAME = "trainer_state.json"  # what the Trainer writes last into a checkpoint


def mlm_accuracy(eval_pred) -> dict[str, float]:
    preds, labels = eval_pred.predictions, eval_pred.label_ids
    masked = labels != -100
    return {"accuracy": float((preds[masked] == labels[masked]).mean()) if masked.any() else float("nan")}


class StopAfterSteps(TrainerCallback):
    """train.stop_after_steps: end training after ``steps`` optimizer steps, with an evaluation at that step; the
    schedules, built for max_steps, are not shortened."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            control.should_training_stop = True
            control.should_evaluate = True
        return control


@dataclass
class PretrainJob:
    cfg: ExperimentConfig
    data_dir: Path | None
    output_root: Path
    callbacks: list[TrainerCallback] = field(default_factory=list)
    data: PretrainData | None = None

    def prepare(self) -> None:
        """Everything that can fail on bad input, before a run directory exists."""
        cfg = self.cfg
        # the teacher first: a missing one is found in a moment, not after featurizing the corpus
        teacher = resolve_pretrained(cfg.kd.teacher, self.output_root, "kd.teacher") if cfg.kd else None
        self.tokenizer = load_tokenizer(cfg.model.tokenizer, self.output_root)
        # featurize once per node: the local main process fills the datasets cache, the others load it
        with process_state().local_main_process_first():
            self.data = build_pretrain_data(cfg.data, self.tokenizer, self.data_dir, cfg.seed)
        self.model = prepare_model(build_mlm_model(cfg.model, self.tokenizer, cfg.data, self.output_root), cfg)
        self.hooks = build_hooks(cfg, self.model, cfg.train.max_steps, cfg.seed, teacher,
                                 lambda source: load_mlm_model(source, cfg.model.attn_implementation))

    # what a task trained on the corpus by another objective (jobs/upstream_pruning.py) replaces
    label_names: ClassVar[list[str] | None] = None  # the Trainer's default: "labels"

    def collator(self):
        return MLMCollator.for_data(self.cfg.data, self.tokenizer, mask_seed=self.cfg.seed)

    def metric_functions(self) -> dict[str, Any]:
        """The Trainer's evaluation arguments: masked-token accuracy from argmax ids, not vocabulary logits."""
        return {"compute_metrics": mlm_accuracy, "preprocess_logits_for_metrics": scatter_masked_predictions}

    def ready(self, trainer: SparseBertTrainer) -> None:
        """Called once the Trainer exists (it knows the device and precision), before training."""

    def export(self, trainer: SparseBertTrainer, directory: Path) -> None:
        trainer.save_model(str(directory))  # safetensors; sparse weights are exact zeros
        if trainer.is_world_process_zero():
            publish_tree(directory)  # safetensors writes model.safetensors 0600: a shared model must be readable

    def resume_checkpoint(self, run_dir: Path) -> Path | None:
        """The checkpoint ``--resume`` continues from; None: the run starts at step 0."""
        if not run_dir.is_dir():
            return None
        return last_complete_checkpoint(run_dir, sparse=self.hooks.get("sparsity") is not None,
                                        below_step=self.cfg.train.stop_after_steps)

    def train(self, run_dir: Path, resume: bool) -> dict[str, Any]:
        assert self.data is not None, "prepare() first"
        cfg = self.cfg
        checkpoint = self.resume_checkpoint(run_dir) if resume else None
        # a resumed run has its evaluation before training in the checkpoint's log history already
        train = replace(cfg.train, eval_at_start=cfg.train.eval_at_start and checkpoint is None)
        args = training_arguments(train, run_dir, cfg.seed, cfg.name, label_names=self.label_names)
        compile_watch = CompileWatch() if cfg.train.torch_compile else None
        stop = [StopAfterSteps(cfg.train.stop_after_steps)] if cfg.train.stop_after_steps else []
        trainer = SparseBertTrainer(
            model=self.model,
            args=args,
            train_dataset=self.data.train,
            eval_dataset=self.data.eval,
            data_collator=self.collator(),
            processing_class=self.tokenizer,
            callbacks=[*self.callbacks, *([compile_watch] if compile_watch else []), *stop],
            tokens_per_sample=cfg.data.max_seq_length,
            **self.metric_functions(),
            **self.hooks,
        )
        self.ready(trainer)
        if checkpoint is not None and trainer.sparsity is not None:
            load_masks(trainer.sparsity, checkpoint)  # the masks that go with the checkpoint's weights
        totals = TrainingTotals(trainer)  # the steps, time and loss behind the model, carried across resumes
        trainer.add_callback(totals)
        result = trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
        final = last_eval(trainer) or trainer.evaluate()
        self.export(trainer, run_dir / "model")
        metrics = pretrain_metrics(trainer, totals.at_end(result), final, self.data, cfg.train.global_batch_size)
        if trainer.is_world_process_zero():  # plain data for loss curves (--plot loss), beside metrics.json
            atomic_write_json(run_dir / "log_history.json", trainer.state.log_history)
        if compile_watch is not None and compile_watch.at_warmup_end is not None:
            metrics["recompiles_after_warmup"] = compile_watch.recompiles
        if trainer.sparsity is not None:
            report = trainer.sparsity.report()
            metrics["sparsity"] = report["selected"]["sparsity"]
            metrics["sparsity_headline"] = report["headline"]
        return metrics


def checkpoint_step(path: Path) -> int | None:
    prefix, _, step = path.name.partition("-")
    return int(step) if prefix == "checkpoint" and step.isdigit() and path.is_dir() else None


def missing_checkpoint_files(checkpoint: Path, sparse: bool) -> list[str]:
    """Files a checkpoint needs to resume from. The Trainer writes the weights, the optimizer state with the
    sparsity masks, the RNG state, then trainer_state.json: a crash in between leaves a directory without the
    later ones."""
    needed = [TRAINER_STATE_NAME, *((MASKS_FILE, STATE_FILE) if sparse else ())]
    return [name for name in needed if not (checkpoint / name).is_file()]


def damaged_checkpoint_file(checkpoint: Path) -> str | None:
    """The first file of ``checkpoint`` that does not read back whole, named with what is wrong; None if none.

    Safetensors files must have a header that parses and describes the file's length, JSON files must parse, and
    the archives of ``torch.save`` (optimizer, scheduler, RNG states) must match the CRC of every member. A
    damaged file would otherwise fail the resume deep in the Trainer with a traceback."""
    for path in sorted(checkpoint.iterdir()):
        check = _FILE_CHECKS.get(path.suffix)
        problem = check(path) if check is not None and path.is_file() else None
        if problem is not None:
            return f"{path} {problem}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if size < 8 or length > size - 8:
            return "is cut short or its header length is garbage"
        try:
            header = json.loads(f.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "has an unreadable header"
    return None if 8 + length + end == size else f"has {size} bytes where its header describes {8 + length + end}"


def _json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes())
    except ValueError as e:
        return f"is not valid JSON ({e})"
    return None


def _archive_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as e:
        return f"is not a readable torch.save archive ({e})"
    return None if bad is None else f"fails the checksum of its member {bad}"


_FILE_CHECKS = {".safetensors": _safetensors_problem, ".json": _json_problem, ".pt": _archive_problem,
                ".pth": _archive_problem, ".bin": _archive_problem}


def last_complete_checkpoint(run_dir: Path, sparse: bool, below_step: int | None = None) -> Path | None:
    """The newest ``checkpoint-N`` that holds everything a resume loads, whole. Newer incomplete ones (a crash
    while saving) are skipped; so are damaged ones, with a warning, but when no whole checkpoint is left the
    damage is an error: starting over would silently throw the run's progress away. ``below_step``: only
    checkpoints before that step (train.stop_after_steps: a resume from the stop step would train one step past
    it before the stop could take effect)."""
    steps = {path: step for path in run_dir.glob("checkpoint-*")
             if (step := checkpoint_step(path)) is not None and (below_step is None or step < below_step)}
    damaged = []
    for checkpoint in sorted(steps, key=steps.__getitem__, reverse=True):
        missing = missing_checkpoint_files(checkpoint, sparse)
        if missing:
            log.warning("--resume: skipping the incomplete checkpoint %s (no %s; a crash while it was saved?)",
                        checkpoint, ", ".join(missing))
            continue
        problem = damaged_checkpoint_file(checkpoint)
        if problem is None:
            return checkpoint
        log.warning("--resume: skipping the damaged checkpoint %s (%s)", checkpoint.name, problem)
        damaged.append(problem)
    if damaged:
        raise SparseBertError(f"--resume: no whole checkpoint in {run_dir}: {damaged[0]}; delete that checkpoint "
                              "to start the run over, or pass --overwrite")
    return None


def load_masks(controller: SparsityController, checkpoint: Path) -> None:
    """Restore the masks saved with ``checkpoint``; a file that does not fit this run is bad input, not a bug."""
    try:
        controller.load(checkpoint)
    except (OSError, ValueError, SafetensorError) as e:
        raise SparseBertError(f"--resume: cannot load the sparsity masks of {checkpoint}: {e}") from None


def last_eval(trainer) -> dict[str, float] | None:
    """The evaluation the Trainer already ran at the final step, if any (no need to run it twice)."""
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry:
            return entry if entry.get("step") == trainer.state.global_step else None
    return None


def pretrain_metrics(trainer, totals: Totals, final: dict[str, float], data: PretrainData,
                     samples_per_step: int) -> dict:
    """``totals``: the steps behind the model, over every process that trained them (a resumed run's included).
    Train loss, runtime and samples/s are counted over them: the Trainer's own figures cover only this process's
    steps (none, in a resume from the final checkpoint), and its samples/s assumes the whole max_steps schedule ran
    (transformers 5.17 doubles a run stopped halfway by train.stop_after_steps)."""
    initial = next((h for h in trainer.state.log_history if "eval_loss" in h and h.get("step") == 0), None)
    samples_per_second = totals.samples_per_second(samples_per_step)
    out: dict[str, Any] = {
        "eval_loss": final["eval_loss"],
        "perplexity": math.exp(final["eval_loss"]),
        "masked_accuracy": final.get("eval_accuracy"),
        "global_step": trainer.state.global_step,
        "train_loss": totals.train_loss,
        "train_runtime_s": totals.seconds,
        "train_samples_per_second": samples_per_second,
        "train_tokens_per_second": (samples_per_second or 0.0) * trainer.tokens_per_sample,
        "train_blocks": len(data.train),
        "eval_blocks": len(data.eval),
        "train_documents": data.train_documents,
        "eval_documents": data.eval_documents,
    }
    if initial is not None:
        out["initial_eval_loss"] = initial["eval_loss"]
        out["initial_perplexity"] = math.exp(initial["eval_loss"])
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in out.items()}
