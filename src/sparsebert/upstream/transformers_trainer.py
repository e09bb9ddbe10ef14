"""Every private name of the Transformers Trainer and TrainingArguments that sparsebert touches.

Trainer methods overridden (``UpstreamTrainer`` below turns each into a public hook of ours):
- ``Trainer._clip_grad_norm(model)``: the clipping stage; clip-in-optimizer replaces it on fused AdamW.
- ``Trainer._save_optimizer_and_scheduler(output_dir)``: the masks are written with the optimizer state, before
  ``trainer_state.json`` marks the checkpoint complete.
- ``Trainer._issue_warnings_after_load(load_result)``: tied weights reported missing on resume are filtered out.
- ``Trainer._run_epoch(...)``: an epoch can be skipped (a resume from the final checkpoint: the Trainer would train
  one step past ``max_steps``).
Trainer attributes:
- ``Trainer._created_lr_scheduler``: set with a scheduler of ours, so the Trainer recreates it on the next
  ``train()`` as it does its own.
- ``Trainer._train_batch_size``: the per-device batch the Trainer actually uses (named in an error message).
- ``Trainer._total_loss_scalar``, ``Trainer._tr_loss`` (set while ``train()`` runs): the running sum of the
  training loss, logged and not yet logged, which a checkpoint carries over to the resumed run (totals.py).
- ``TrainingArguments._n_gpu``: the process trains on one GPU where the Trainer would use DataParallel.

``PRIVATE_NAMES`` lists them for tests/upstream/test_trainer.py. torch's private names are in torch_ops.py.
"""

from __future__ import annotations

from transformers import Trainer, TrainingArguments

# (owner, attribute) pairs the test checks; instance attributes are checked on an instance there
PRIVATE_NAMES = {
    "Trainer methods": ["_clip_grad_norm", "_save_optimizer_and_scheduler", "_issue_warnings_after_load",
                        "_run_epoch"],
    "Trainer attributes": ["_created_lr_scheduler", "_train_batch_size"],
    "Trainer attributes while training": ["_total_loss_scalar", "_tr_loss"],
    "TrainingArguments attributes": ["_n_gpu"],
}


class UpstreamTrainer(Trainer):
    """The Trainer with its private hooks routed to public methods that SparseBertTrainer overrides. Each
    default does what the Trainer itself does."""

    def _clip_grad_norm(self, model):
        return self.clip_gradients(model)

    def trainer_clip_grad_norm(self, model):
        """The Trainer's own clipping (``clip_grad_norm_`` through Accelerate); returns the pre-clip norm."""
        return Trainer._clip_grad_norm(self, model)

    def clip_gradients(self, model):
        return self.trainer_clip_grad_norm(model)

    def _save_optimizer_and_scheduler(self, output_dir, *args, **kwargs):
        Trainer._save_optimizer_and_scheduler(self, output_dir, *args, **kwargs)
        self.after_optimizer_state_saved(output_dir)

    def after_optimizer_state_saved(self, output_dir) -> None:
        """Called inside every checkpoint save, after the optimizer state and before ``trainer_state.json``."""

    def _issue_warnings_after_load(self, load_result) -> None:
        Trainer._issue_warnings_after_load(self, self.filter_load_result(load_result))

    def filter_load_result(self, load_result):
        """The load result the Trainer warns about when a checkpoint is loaded."""
        return load_result

    def _run_epoch(self, *args, **kwargs):
        if self.skip_epoch():
            return None
        return Trainer._run_epoch(self, *args, **kwargs)

    def skip_epoch(self) -> bool:
        """Whether the training loop skips the epoch it is about to run (the Trainer runs each one)."""
        return False

    def loss_sum_since_train_began(self) -> float:
        """The summed training loss of the steps this ``train()`` call has run so far: the Trainer's running sum
        of what it logged plus what it has not logged yet (one host-device sync; call it at checkpoints only)."""
        return self._total_loss_scalar + float(self._tr_loss.item())

    def adopt_lr_scheduler(self, scheduler) -> None:
        """Install a scheduler built by us as if the Trainer had built it (so a new ``train()`` rebuilds it)."""
        self.lr_scheduler = scheduler
        self._created_lr_scheduler = True

    @property
    def per_device_train_batch(self) -> int:
        return self._train_batch_size


def train_on_one_gpu(args: TrainingArguments) -> None:
    """What TrainingArguments itself sets for one device; ``n_gpu`` reads it."""
    args._n_gpu = 1

