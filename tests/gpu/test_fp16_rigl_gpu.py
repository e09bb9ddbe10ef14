"""fp16 + RigL on a GPU with a forced overflow, through the real pretraining job (``sparse_tiny_rigl`` with
``train.precision=fp16``, run by the runner as run.py runs it): the gradients of one RigL update step are made
inf during its backward, so the GradScaler skips that step. RigL does not update on it (the controller's step
count and masks stay as they were; the update comes at the next real step instead, see
``SparsityController.on_optimizer_step``), masks stay exact and masked weights exactly 0 after every step, and the
log counter ``fp16_skipped_steps`` is 1.

Skipped, with the reason, where there is no CUDA GPU (CI has none). Needs the real data (``$SPARSEBERT_DATA``:
one Wikipedia file) and a tokenizer (``tokenizer_dir``, tests/gpu/conftest.py). About 20 s on an H100.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import TrainerCallback

from sparsebert.config import ExperimentRegistry
from sparsebert.runner import RunOptions, run_experiment
from sparsebert.sparsity import rigl_update_due
from sparsebert.trainer.sparse_training import SparsityCallback

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FORCED = 8  # the 8th optimizer step: RigL's 2nd update (every 4 steps) is due there
STEPS = 16  # RigL ends at 75 %: updates after controller steps 4 and 8 only
OVERFLOWED = "encoder.layer.0.attention.self.query.weight"  # a sparse layer: its growth gradient is inf too


class ForceOverflow(TrainerCallback):
    """Makes one sparse layer's gradient inf in every backward of optimizer step ``step`` (1-based), nothing else:
    the loss stays finite, as after a real fp16 overflow inside the backward."""

    def __init__(self, step: int):
        self.step, self.armed, self.fired = step, False, 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        param = next(p for n, p in model.named_parameters() if n.endswith(OVERFLOWED))
        param.register_hook(self._hook)

    def _hook(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self.armed:
            return None
        self.fired += 1
        return torch.full_like(grad, float("inf"))

    def on_step_begin(self, args, state, control, **kwargs):
        self.armed = state.global_step + 1 == self.step  # global_step counts the steps done

    def on_step_end(self, args, state, control, **kwargs):
        self.armed = False


def test_fp16_overflow_skips_the_rigl_update_and_keeps_masks_exact(data_dir, tmp_path, monkeypatch, tokenizer_dir):
    tokenizer = tokenizer_dir
    cfg = ExperimentRegistry.builtin().build("sparse_tiny_rigl", [
        f"model.tokenizer={tokenizer}", "train.precision=fp16", f"train.max_steps={STEPS}", "rigl.update_freq=4",
        "data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=32", "data.max_seq_length=64",
        "train.global_batch_size=8", "train.warmup_steps=0", "train.logging_steps=1", "train.eval_steps=1000",
        "train.save_steps=1000", "train.report_to=[]"])
    assert cfg.train.precision == "fp16" and cfg.rigl is not None

    records = []  # one per optimizer step, from the real SparsityCallback
    real = SparsityCallback.on_optimizer_step

    def observed(self, args, state, control, **kwargs):
        c = self.controller
        step, version, masks = c.step, c.mask_version, {n: m.clone() for n, m in c.masks.items()}
        real(self, args, state, control, **kwargs)
        records.append({
            # the scaler's own verdict (its scale fell); Accelerate's step_was_skipped misses it for fused AdamW
            "skipped": self.trainer.skipped_steps.last_step_skipped(),
            "step_before": step, "step_after": c.step, "updated": c.mask_version != version,
            "masks_kept": all(torch.equal(masks[n], c.masks[n]) for n in masks),
            "active": {n: int(m.sum()) for n, m in c.masks.items()},
            "masks_bool": all(m.dtype == torch.bool and m.shape == c.params[n].shape for n, m in c.masks.items()),
            "zeros": all(bool((c.params[n].detach()[~c.masks[n]] == 0).all()) for n in c.masks),
            "due": rigl_update_due(c.step, c.rigl, c.rigl_end_step),
        })

    monkeypatch.setattr(SparsityCallback, "on_optimizer_step", observed)
    force = ForceOverflow(FORCED)
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=data_dir), callbacks=[force])

    assert force.fired >= 1 and len(records) == STEPS
    skipped = [i + 1 for i, r in enumerate(records) if r["skipped"]]
    assert skipped == [FORCED], f"steps the scaler skipped: {skipped} (expected only the forced one)"
    at_skip, after = records[FORCED - 1], records[FORCED]
    # the skipped step: no controller step, no RigL update, masks as they were, though an update was due
    assert at_skip["step_after"] == at_skip["step_before"] == FORCED - 1
    assert rigl_update_due(FORCED, cfg.rigl, FORCED + 1) and not at_skip["updated"] and at_skip["masks_kept"]
    # the update comes at the next real step, which is controller step FORCED
    assert after["step_after"] == FORCED and after["updated"]
    # every real step counts once, and RigL updates exactly where its schedule says (controller steps 4 and 8)
    assert [r["step_after"] for r in records] == [*range(1, FORCED), FORCED - 1, *range(FORCED, STEPS)]
    updates = [r["step_after"] for r in records if r["updated"]]
    assert updates == [r["step_after"] for r in records if r["due"] and not r["skipped"]] == [4, 8]
    # masks exact after every step: boolean, the same number of active weights per layer as at the start
    # (RigL moves weights, never adds or removes them), and every masked weight exactly 0
    assert all(r["masks_bool"] and r["zeros"] for r in records)
    assert all(r["active"] == records[0]["active"] for r in records)

    history = json.loads((tmp_path / "sparse_tiny_rigl" / "log_history.json").read_text())
    counters = [(h["step"], h["fp16_skipped_steps"]) for h in history if "fp16_skipped_steps" in h]
    assert counters and counters[0] == (FORCED, 1) and {n for _, n in counters} == {1}, counters
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history if "loss" in h)
    assert [h["step"] for h in history if "rigl/moved_total" in h] == [4, FORCED + 1]
