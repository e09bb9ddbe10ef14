"""finetune.gpu_fast_path: on a GPU each run trains with one shape, compiled with CUDA graphs; on a CPU nothing
changes. The flag is resolved before the run directory is checked or written, so config.json says what ran."""

from __future__ import annotations

import dataclasses
import json

import pytest

import sparsebert.runner as runner
from sparsebert.config import ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.fast_path import with_gpu_fast_path
from sparsebert.runner import RunOptions, run_experiment

REGISTRY = ExperimentRegistry.builtin()
# one optimizer step of tiny_glue on RTE, no model export
ONE_STEP = ['finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=16",
            "finetune.max_eval_samples=16", "finetune.save_model=false"]


def test_on_a_gpu_the_run_compiles_one_shape_with_cuda_graphs():
    cfg = REGISTRY.build("minilm_glue")
    assert cfg.finetune.gpu_fast_path and not cfg.train.torch_compile
    fast = with_gpu_fast_path(cfg, on_gpu=True)
    assert (fast.train.torch_compile, fast.train.torch_compile_mode, fast.train.drop_last_batch) == (
        True, "reduce-overhead", True)
    assert fast.finetune.pad_to_multiple_of == cfg.finetune.max_seq_length == 128
    # nothing else moves
    assert dataclasses.replace(fast.train, torch_compile=False, torch_compile_mode="default",
                               drop_last_batch=False) == cfg.train
    assert fast.model == cfg.model and fast.finetune.runs_per_task == cfg.finetune.runs_per_task
    assert not fast.finetune.gpu_fast_path  # consumed: config.json shows the settings it stood for
    assert fast.finetune.parallel_runs == 1  # what this process can run side by side: 1 unless told


def test_on_a_gpu_the_runs_go_side_by_side_unless_the_experiment_says_how_many():
    cfg = REGISTRY.build("minilm_glue")
    assert cfg.finetune.parallel_runs is None
    assert with_gpu_fast_path(cfg, on_gpu=True, runs_at_once=4).finetune.parallel_runs == 4
    one = REGISTRY.build("minilm_glue", ["finetune.parallel_runs=1"])
    assert with_gpu_fast_path(one, on_gpu=True, runs_at_once=4).finetune.parallel_runs == 1
    assert with_gpu_fast_path(cfg, on_gpu=False, runs_at_once=4).finetune.parallel_runs is None  # one at a time


@pytest.mark.parametrize(("gib", "gpus", "cores", "runs"),
                         [(80, 1, 16, 4), (24, 1, 16, 3), (16, 1, 16, 2), (6, 1, 16, 1),
                          (80, 4, 64, 16), (24, 2, 16, 6),  # up to 4 a GPU on each GPU: the job spreads them
                          (80, 4, 8, 8), (80, 1, 2, 2)])  # and at most one per core: each run's step is host-bound
def test_the_runs_at_once_fit_the_gpus_and_the_cores(monkeypatch, gib, gpus, cores, runs):
    import torch

    import sparsebert.data.featurize as featurize
    from sparsebert.jobs.finetune.fast_path import gpu_runs_at_once

    class Properties:
        total_memory = gib * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(featurize, "available_cores", lambda: cores)
    assert gpu_runs_at_once() == runs


def test_the_smallest_gpu_sets_the_runs_a_gpu(monkeypatch):
    """An 80 GiB GPU beside a 16 GiB one (either may be device 0): 2 runs each, as the 16 GiB one holds."""
    import torch

    import sparsebert.data.featurize as featurize
    from sparsebert.jobs.finetune.fast_path import gpu_runs_at_once

    monkeypatch.setattr(featurize, "available_cores", lambda: 16)
    for sizes in ([80, 16], [16, 80]):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device, sizes=sizes: type("P", (), {"total_memory": sizes[device] * 2**30}))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        assert gpu_runs_at_once() == 4


@pytest.mark.parametrize(("world", "callbacks", "runs"), [("1", [], 4), ("1", [object()], 1), ("2", [], 1)])
def test_runs_stay_in_this_process_where_workers_cannot_follow(monkeypatch, world, callbacks, runs):
    """--profile's callbacks and a multi-process launch keep the runs in this process: the fast path then trains
    them one at a time instead of refusing the job."""
    from sparsebert.trainer.termination import StopWhenTerminated

    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: True)
    monkeypatch.setattr(runner, "gpu_runs_at_once", lambda: 4)
    callbacks = [StopWhenTerminated(lambda: None), *callbacks]
    assert runner.gpu_and_runs_at_once(REGISTRY.build("minilm_glue"), callbacks) == (True, runs)


def test_the_eager_recipes_and_a_set_number_are_left_alone(monkeypatch):
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: True)
    monkeypatch.setattr(runner, "gpu_runs_at_once", lambda: 4)
    assert runner.gpu_and_runs_at_once(REGISTRY.build("minilm_glue_eager"), []) == (True, 1)
    assert runner.gpu_and_runs_at_once(REGISTRY.build("minilm_glue", ["finetune.parallel_runs=2"]), []) == (True, 1)
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: False)
    assert runner.gpu_and_runs_at_once(REGISTRY.build("minilm_glue"), []) == (False, 1)


def test_a_cpu_run_and_the_eager_recipes_stay_eager():
    cfg = REGISTRY.build("minilm_glue")
    cpu = with_gpu_fast_path(cfg, on_gpu=False)
    assert cpu == dataclasses.replace(cfg, finetune=dataclasses.replace(cfg.finetune, gpu_fast_path=False))
    for name in ("minilm_glue_eager", "minilm_glue_sparse80", "minilm_glue_downstream80", "minilm_glue_2to4"):
        eager = REGISTRY.build(name)
        assert with_gpu_fast_path(eager, on_gpu=True) is eager, name


def test_a_compile_mode_the_user_chose_is_kept():
    cfg = REGISTRY.build("minilm_glue", ["train.torch_compile=true", "train.torch_compile_mode=max-autotune"])
    assert with_gpu_fast_path(cfg, on_gpu=True).train.torch_compile_mode == "max-autotune"


@pytest.mark.slow
def test_a_cpu_run_records_eager_settings_and_a_run_from_before_the_flag_is_the_same(data_dir, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: False)
    cfg = REGISTRY.build("tiny_glue", [*ONE_STEP, "finetune.gpu_fast_path=true"])
    opts = RunOptions(output_root=tmp_path, data_dir=data_dir)
    run_experiment(cfg, opts)
    saved_path = tmp_path / "tiny_glue" / "config.json"
    saved = json.loads(saved_path.read_text())
    assert saved["finetune"]["gpu_fast_path"] is False and saved["train"]["torch_compile"] is False
    run = json.loads((tmp_path / "tiny_glue" / "glue_rte" / "run0" / "config.json").read_text())
    assert run["finetune"]["pad_to_multiple_of"] == 8 and not run["train"]["drop_last_batch"]
    # a run finished before the flag existed: its config.json has no such key, and it is the same experiment
    del saved["finetune"]["gpu_fast_path"]
    saved_path.write_text(json.dumps(saved))
    assert run_experiment(cfg, opts) is None  # skipped as finished, not refused


@pytest.mark.slow
def test_an_eager_run_is_not_taken_for_the_gpu_runs_experiment(data_dir, tmp_path, monkeypatch):
    """The same experiment asked for on a GPU has other settings than its finished CPU run: refused before any
    training, naming them (a job resumed on the other kind of machine would mix the two paths)."""
    opts = RunOptions(output_root=tmp_path, data_dir=data_dir)
    cfg = REGISTRY.build("tiny_glue", [*ONE_STEP, "finetune.gpu_fast_path=true"])
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: False)
    run_experiment(cfg, opts)
    monkeypatch.setattr(runner, "trains_on_gpu", lambda: True)
    monkeypatch.setattr(runner, "gpu_runs_at_once", lambda: 4)  # runs at once: no setting of the runs
    with pytest.raises(SparseBertError, match=r"other settings \(finetune.pad_to_multiple_of, train.drop_last_batch"):
        run_experiment(cfg, opts)
