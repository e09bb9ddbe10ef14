"""train.torch_compile_scope=layers: each encoder layer compiled on its own, the same losses as eager (CPU).

Dropout is off in both runs: compiled dropout draws from another random stream than eager dropout, so with it
on the two runs would be different (equally valid) samples rather than the same computation.
"""

from __future__ import annotations

from pathlib import Path

import accelerate.accelerator
import pytest
from trainer_helpers import TrainLogs

from sparsebert.config import ExperimentRegistry
from sparsebert.runner import RunOptions, run_experiment

TINY = [
    "data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16", "data.max_seq_length=64",
    "train.global_batch_size=8", "train.max_steps=4", "train.eval_steps=100", "train.save_steps=100",
    "train.logging_steps=1", "train.report_to=[]", "train.warmup_steps=0", "train.eval_at_start=false",
    "model.hidden_dropout=0", "model.attention_dropout=0",
]

pytestmark = pytest.mark.slow


def train_losses(data_dir: Path, out: Path, extra: list[str]) -> list[float]:
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", TINY + extra)
    log = TrainLogs()
    run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir), callbacks=[log])
    return log.losses


def test_layer_scope_compiles_regions_and_matches_eager(data_dir, tmp_path, monkeypatch):
    regions: list[str] = []
    compile_regions = accelerate.accelerator.compile_regions

    def recording(module, **kwargs):
        compiled = compile_regions(module, **kwargs)
        regions.extend(name for name, m in compiled.named_modules() if type(m).__name__ == "OptimizedModule")
        return compiled

    monkeypatch.setattr(accelerate.accelerator, "compile_regions", recording)
    eager = train_losses(data_dir, tmp_path / "eager", [])
    compiled = train_losses(data_dir, tmp_path / "layers", ["train.torch_compile=true",
                                                              "train.torch_compile_scope=layers"])
    # every encoder layer is its own compiled module (bert_tiny_quick has 2), and so are the other parts
    assert {"bert.encoder.layer.0", "bert.encoder.layer.1"} <= set(regions), regions
    assert not any(name.startswith("bert.encoder.layer.0.") for name in regions)  # a layer is compiled whole
    assert len(eager) == len(compiled) == 4
    # fp32 on CPU: fused kernels only reorder sums, so the trajectories agree to float rounding
    assert compiled == pytest.approx(eager, rel=1e-3, abs=1e-3)


def finetune_compiles(data_dir: Path, out: Path, monkeypatch, extra: list[str]) -> tuple[int, list]:
    """Dynamo compiles (frames compiled, recompiles included) of a tiny RTE finetuning whose batches come in
    several shapes (dynamic padding to a multiple of 8, and a short last batch), and the ``dynamic`` argument
    torch.compile got. Dynamo traces, guards and recompiles exactly as with Inductor; only the backend that
    turns each graph into kernels is swapped for eager to keep the test fast."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    seen: list = []
    real_compile = getattr(torch.compile, "real", torch.compile)

    def eager_backend_compile(model, **kwargs):
        seen.append(kwargs.get("dynamic"))
        return real_compile(model, **{**kwargs, "backend": "eager", "mode": None})

    eager_backend_compile.real = real_compile
    monkeypatch.setattr(torch, "compile", eager_backend_compile)
    torch._dynamo.reset()
    counters.clear()
    cfg = ExperimentRegistry.builtin().build("tiny_glue", [
        'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=44",
        "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8", "train.epochs=1",
        "train.torch_compile=true", *extra])
    run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir))
    return counters["stats"]["unique_graphs"], seen


def test_dynamic_shapes_compile_once_for_every_batch_shape(data_dir, tmp_path, monkeypatch):
    default, seen_default = finetune_compiles(data_dir, tmp_path / "default", monkeypatch, [])
    dynamic, seen_dynamic = finetune_compiles(data_dir, tmp_path / "dynamic", monkeypatch,
                                              ["train.torch_compile_dynamic=true"])
    assert seen_default == [None] and seen_dynamic == [True]
    # RTE rows differ in length, and 44 = 5 x 8 + 4 leaves a short last batch: torch's default compiles the
    # first shape, then again with the sizes that changed made symbolic; symbolic from the start compiles once
    assert default >= 2
    assert dynamic == 1


def test_drop_last_batch_makes_every_batch_one_size(data_dir, tmp_path, monkeypatch):
    """44 rows at batch 8: 6 steps of which the last has 4 rows; dropping it leaves 5 full steps, so with padding to
    the maximum length a compiled model sees one shape and compiles once."""
    steps = {}
    for drop in (False, True):
        logs = TrainLogs()
        cfg = ExperimentRegistry.builtin().build("tiny_glue", [
            'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=44",
            "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8",
            "train.epochs=1", "train.logging_steps=1", f"train.drop_last_batch={str(drop).lower()}"])
        run_experiment(cfg, RunOptions(output_root=tmp_path / str(drop), data_dir=data_dir), callbacks=[logs])
        steps[drop] = len(logs.logs)
    assert steps == {False: 6, True: 5}
    # evaluation keeps every row: the 8 dev rows are fewer than one eval batch, and all are scored
    predictions = next((tmp_path / "True").glob("tiny_glue/glue_rte/run0/predictions_dev.tsv"))
    assert len(predictions.read_text().splitlines()) == 1 + 8


def test_one_shape_compiled_finetuning_matches_eager(data_dir, tmp_path, monkeypatch):
    """finetune.gpu_fast_path's settings on a tiny model: every training batch padded to 128 with the short last batch
    dropped, compiled in reduce-overhead mode (CUDA graphs on a GPU; Inductor alone on a CPU), give the losses of
    the same run in eager mode. Dropout is off, as above."""
    import torch

    modes: list = []
    real_compile = torch.compile

    def recording_compile(model, **kwargs):
        modes.append(kwargs.get("mode"))
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)

    def losses(extra: list[str], out: Path) -> list[float]:
        logs = TrainLogs()
        cfg = ExperimentRegistry.builtin().build("tiny_glue", [
            'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=44",
            "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8",
            "train.epochs=1", "train.logging_steps=1", "finetune.pad_to_multiple_of=128",
            "train.drop_last_batch=true", "model.hidden_dropout=0", "model.attention_dropout=0", *extra])
        run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir), callbacks=[logs])
        return logs.losses

    eager = losses([], tmp_path / "eager")
    compiled = losses(["train.torch_compile=true", "train.torch_compile_mode=reduce-overhead"], tmp_path / "fast")
    assert modes == ["reduce-overhead"]  # the eager run compiled nothing, the fast one once, in that mode
    assert len(eager) == len(compiled) == 5
    assert compiled == pytest.approx(eager, rel=1e-3, abs=1e-3)


def test_drop_last_batch_refuses_a_training_set_smaller_than_one_batch(data_dir, tmp_path):
    from sparsebert.errors import SparseBertError

    cfg = ExperimentRegistry.builtin().build("tiny_glue", [
        'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=4",
        "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8",
        "train.drop_last_batch=true"])
    with pytest.raises(SparseBertError, match="4 training rows are fewer than one batch of 8"):
        run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))
    assert not (tmp_path / "tiny_glue").exists()  # refused before the run directory: a fixed command runs at once


def test_drop_last_batch_refuses_pretraining_data_smaller_than_one_batch(data_dir, tmp_path):
    """Without the check the Trainer runs no step, logs a warning and the run reports success."""
    from sparsebert.errors import SparseBertError

    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [
        *TINY, "data.max_documents=3", "data.eval_documents=1", "train.global_batch_size=512",
        "train.drop_last_batch=true"])
    with pytest.raises(SparseBertError, match=r"training rows are fewer than one batch of 512 per device x 1"):
        run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir))


def test_static_mask_count_pretrains_like_the_exact_decoder(data_dir, tmp_path):
    """data.static_mask_count changes shapes, not results: the same masks (the cap is far above any real count)
    and the same losses, eager and compiled (one graph for the whole step)."""
    exact = train_losses(data_dir, tmp_path / "exact", [])
    static = train_losses(data_dir, tmp_path / "static", ["data.static_mask_count=true"])
    compiled = train_losses(data_dir, tmp_path / "compiled", ["data.static_mask_count=true",
                                                              "train.torch_compile=true"])
    assert len(exact) == len(static) == len(compiled) == 4
    assert static == pytest.approx(exact, rel=1e-5, abs=1e-5)
    assert compiled == pytest.approx(exact, rel=1e-3, abs=1e-3)


def test_static_mask_count_distills_like_the_exact_decoder(data_dir, tmp_path):
    """With kd the student's filler rows have no teacher row: only the masked rows are distilled, so the losses
    equal the exact decoder's (alpha 1: the logged loss is the distillation term alone)."""
    teacher_cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [*TINY, "train.max_steps=2"])
    run_experiment(teacher_cfg, RunOptions(output_root=tmp_path / "teacher", data_dir=data_dir))
    kd = [f"kd.teacher={tmp_path / 'teacher' / 'bert_tiny_quick'}", "kd.alpha=1.0"]
    exact = train_losses(data_dir, tmp_path / "exact", kd)
    static = train_losses(data_dir, tmp_path / "static", [*kd, "data.static_mask_count=true"])
    assert len(exact) == len(static) == 4
    assert max(exact) < 2.0  # a KL term between two barely trained models, not the ~10-nat MLM loss
    assert static == pytest.approx(exact, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("per_device,drop", [(2, True), (2, False), (8, True)])
def test_schedule_length_is_the_trainers_step_count(data_dir, tmp_path, per_device, drop):
    """RigL / GMP lay their schedules over total_optimizer_steps: it must count what the Trainer runs, also when
    the short last micro-batch is dropped under gradient accumulation (44 rows, global batch 8)."""
    from sparsebert.jobs.finetune.common import total_optimizer_steps

    logs = TrainLogs()
    cfg = ExperimentRegistry.builtin().build("tiny_glue", [
        'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=44",
        "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8",
        f"train.per_device_batch_size={per_device}", "train.epochs=1", "train.logging_steps=1",
        f"train.drop_last_batch={str(drop).lower()}"])
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir), callbacks=[logs])
    assert len(logs.logs) == total_optimizer_steps(cfg, 44)
