"""fp16 skipped steps: found from the loss scale (Accelerate's flag misses them for fused AdamW), and a skipped step is
no step for the mask schedules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.state import AcceleratorState

from sparsebert.sparsity import GMPConfig, RigLConfig, SparsityConfig, SparsityController
from sparsebert.trainer.sparse_training import SparsityCallback
from sparsebert.trainer.trainer import PendingLogs, SkippedSteps


def _step(model, optimizer, scaler, watch, overflow: bool) -> None:
    """One fp16-style step: scaled backward (an inf gradient if ``overflow``), the scaler's step and update."""
    loss = scaler.scale(model(torch.ones(2, 8)).pow(2).mean())
    loss.backward()
    if overflow:
        next(model.parameters()).grad.fill_(float("inf"))
    watch.on_pre_optimizer_step(None, None, None)
    scaler.step(optimizer)
    scaler.update()
    watch.on_optimizer_step(None, None, None)
    optimizer.zero_grad()


def test_a_step_the_scaler_skipped_is_found_from_its_scale_with_fused_adamw():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("cpu")
    pending = PendingLogs()
    watch = SkippedSteps(SimpleNamespace(accelerator=SimpleNamespace(scaler=scaler)), pending)
    _step(model, optimizer, scaler, watch, overflow=False)
    assert not watch.last_step_skipped() and pending.drain() == {}
    weights = model.weight.detach().clone()
    _step(model, optimizer, scaler, watch, overflow=True)
    assert watch.last_step_skipped() and pending.drain() == {"fp16_skipped_steps": 1}
    assert torch.equal(model.weight, weights)  # the fused kernel really skipped the update


def test_without_a_scaler_no_step_is_skipped():
    watch = SkippedSteps(SimpleNamespace(accelerator=SimpleNamespace(scaler=None)), PendingLogs())
    watch.on_pre_optimizer_step(None, None, None)
    assert not watch.last_step_skipped()


def test_accelerates_own_flag_misses_the_skip_of_a_fused_optimizer():
    """Why SkippedSteps reads the scale: pinned, so this test fails (and SkippedSteps can go) once Accelerate's
    ``step_was_skipped`` sees the skip itself."""
    model = torch.nn.Linear(8, 4)
    scaler = torch.amp.GradScaler("cpu")
    Accelerator(cpu=True)  # AcceleratedOptimizer reads the process state it sets up
    try:
        optimizer = AcceleratedOptimizer(torch.optim.AdamW(model.parameters(), fused=True), device_placement=False,
                                         scaler=scaler)
        scaler.scale(model(torch.ones(2, 8)).sum()).backward()
        model.weight.grad.fill_(float("inf"))
        before = scaler.get_scale()
        optimizer.step()
        assert scaler.get_scale() < before  # the scaler skipped the step ...
        assert optimizer.step_was_skipped is False  # ... and Accelerate does not know
    finally:
        AcceleratorState._reset_state(True)


def test_the_sparsity_callback_does_not_count_a_skipped_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    controller = SparsityController(model, SparsityConfig(sparsity=0.5, include=["weight$"]),
                                    rigl=RigLConfig(update_freq=1, end_step=10))
    controller.attach_optimizer(torch.optim.AdamW(model.parameters()))
    skipped = SimpleNamespace(last_step_skipped=lambda: True)
    callback = SparsityCallback(controller, SimpleNamespace(skipped_steps=skipped, pending_logs=PendingLogs()))
    masks = {n: m.clone() for n, m in controller.masks.items()}
    callback.on_optimizer_step(None, None, None, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert controller.step == 0 and all(torch.equal(masks[n], controller.masks[n]) for n in masks)


def _gmp_callback(skipped_steps: int) -> tuple[SparsityController, SparsityCallback, PendingLogs]:
    """A GMP schedule ending at step 10 of 10, of which ``skipped_steps`` the fp16 scaler skipped."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    controller = SparsityController(model, SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude"),
                                    gmp=GMPConfig(begin_step=0, end_step=10, frequency=2))
    controller.attach_optimizer(torch.optim.AdamW(model.parameters()))
    verdicts = iter([True] * skipped_steps + [False] * (10 - skipped_steps))
    pending = PendingLogs()
    callback = SparsityCallback(controller, SimpleNamespace(
        skipped_steps=SimpleNamespace(last_step_skipped=lambda: next(verdicts)), pending_logs=pending))
    return controller, callback, pending


def _run_steps(callback: SparsityCallback, steps: int, max_steps: int) -> None:
    for step in range(1, steps + 1):
        callback.on_optimizer_step(None, None, None)
        callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=max_steps), None)


def test_gmp_short_of_its_end_after_skipped_steps_reaches_its_target_at_the_last_step():
    controller, callback, pending = _gmp_callback(skipped_steps=3)
    _run_steps(callback, 9, max_steps=10)
    assert controller.report()["selected"]["sparsity"] < 0.78  # 6 schedule steps so far (0.75): short of the target
    pending.drain()
    callback.on_optimizer_step(None, None, None)
    callback.on_step_end(None, SimpleNamespace(global_step=10, max_steps=10), None)  # the last step, before its eval
    assert controller.step == 7
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-2)
    assert pending.drain()["gmp/sparsity"] == pytest.approx(0.8, abs=1e-2)  # logged with the last step


def test_a_run_stopped_before_max_steps_keeps_the_sparsity_its_schedule_had_reached():
    # train.stop_after_steps (or a termination) ends the run early on purpose: the schedule spans max_steps, and
    # jumping to its target without the recovery steps would export a different model than the one evaluated
    controller, callback, _ = _gmp_callback(skipped_steps=0)
    _run_steps(callback, 4, max_steps=10)
    reached = controller.report()["selected"]["sparsity"]
    callback.on_train_end(SimpleNamespace(output_dir=None), SimpleNamespace(is_world_process_zero=False), None)
    assert controller.report()["selected"]["sparsity"] == reached < 0.7
