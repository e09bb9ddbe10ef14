"""Run one experiment under torchrun and write this rank's parameter digests (used by test_distributed.py).

    torchrun --nproc-per-node 2 tests/helpers/ddp_worker.py OUT_ROOT DATA_DIR EXPERIMENT [KEY=VALUE ...]
    torchrun --nproc-per-node 2 tests/helpers/ddp_worker.py --runs RUNS.json DATA_DIR

The second form runs several experiments one after the other in the same processes (one launch: torchrun and
the workers' imports cost more than a tiny run), RUNS.json a list of {"out": OUT_ROOT, "experiment": NAME,
"overrides": [KEY=VALUE, ...]}; each run starts with the recorded communication counters at zero, and every
experiment is seeded as it starts, so each run is the one a launch of its own would train (test_distributed.py
checks a combined launch against separate ones, weights bit for bit).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from sparsebert.config import ExperimentRegistry  # noqa: E402
from sparsebert.runner import RunOptions, run_experiment  # noqa: E402

# every Trainer.train starts with a full gc.collect (accelerate's free_memory): keep what the imports made out of
# it, for the several runs of one launch
gc.collect()
gc.freeze()


class KillRank(TrainerCallback):
    """SIGKILLs this rank at a given step (a crashed worker), when the test asks for it through the env."""

    def on_step_end(self, args, state, control, **kwargs):
        if (os.environ.get("KILL_RANK") == os.environ.get("RANK")
                and state.global_step == int(os.environ.get("KILL_STEP", "-1"))):
            os.kill(os.getpid(), signal.SIGKILL)


REDUCER_CALLS = [0]  # buckets DDP's reducer all-reduced in this process
ALL_REDUCE_DTYPES: set[str] = set()  # dtypes of the tensors torch.distributed.all_reduce saw
NORMS_FROM_ALL_REDUCE = [0]  # clipped steps whose norm the flat all-reduce summed (train.clip_in_optimizer)
NORM_ERRORS: list[float] = []  # on those steps: |that norm / the gradients' norm in float64 - 1|


def record_communication() -> None:
    """Every DDP model built from now on counts the buckets its reducer all-reduces (with torch's default
    averaging), so a test can tell whether DDP or sparsebert's own sync averaged the gradients; every
    ``torch.distributed.all_reduce`` records its tensor's dtype (what went on the wire); clipping inside the
    fused AdamW step counts the steps whose norm came from the flat all-reduce and how far it is from the norm of
    the gradients the optimizer then sees, taken in float64."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    all_reduce = dist.all_reduce

    def recorded(tensor, *args, **kwargs):
        ALL_REDUCE_DTYPES.add(str(tensor.dtype))
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = recorded

    init = DistributedDataParallel.__init__

    def counted(state, bucket):
        REDUCER_CALLS[0] += 1
        return allreduce_hook(state, bucket)

    def init_and_count(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(None, counted)

    DistributedDataParallel.__init__ = init_and_count

    import torch

    from sparsebert.trainer.clipping import ClipInOptimizer

    clip = ClipInOptimizer.clip

    def counted_clip(self, model, max_norm, norm_from_sync):
        if norm_from_sync is not None:  # the norm the flat all-reduce summed, handed on by the step
            NORMS_FROM_ALL_REDUCE[0] += 1
            grads = [p.grad.double().flatten() for p in model.parameters() if p.grad is not None]
            NORM_ERRORS.append(abs(float(norm_from_sync) / float(torch.linalg.vector_norm(torch.cat(grads))) - 1))
        return clip(self, model, max_norm, norm_from_sync)

    ClipInOptimizer.clip = counted_clip


class RankDigest(TrainerCallback):
    """At the end of training, each rank writes a digest of every parameter and of every zero pattern."""

    def __init__(self, out: Path):
        self.out = out

    def on_train_end(self, args, state, control, model=None, **kwargs):
        rank = int(os.environ.get("RANK", "0"))
        weights, zeros = {}, {}
        for name, p in model.named_parameters():
            data = p.detach().cpu().contiguous()
            weights[name] = hashlib.sha256(data.numpy().tobytes()).hexdigest()
            zeros[name] = hashlib.sha256((data == 0).numpy().tobytes()).hexdigest()
        losses = [h["loss"] for h in state.log_history if "loss" in h]
        grad_norms = [h["grad_norm"] for h in state.log_history if "grad_norm" in h]
        eval_losses = [h["eval_loss"] for h in state.log_history if "eval_loss" in h]
        (self.out / f"rank{rank}.json").write_text(json.dumps(
            {"weights": weights, "zeros": zeros, "losses": losses, "eval_losses": eval_losses,
             "world": int(os.environ.get("WORLD_SIZE", "1")), "reducer_calls": REDUCER_CALLS[0],
             "all_reduce_dtypes": sorted(ALL_REDUCE_DTYPES), "grad_norms": grad_norms,
             "norms_from_all_reduce": NORMS_FROM_ALL_REDUCE[0], "norm_errors": NORM_ERRORS}))


def reset_records() -> None:
    """Zero what record_communication counts, so a digest describes its own run only."""
    REDUCER_CALLS[0] = 0
    ALL_REDUCE_DTYPES.clear()
    NORMS_FROM_ALL_REDUCE[0] = 0
    NORM_ERRORS.clear()


def run_one(out: str, data_dir: str, name: str, overrides: list[str]) -> None:
    reset_records()
    out_root = Path(out)
    cfg = ExperimentRegistry.builtin().build(name, overrides)
    run_experiment(cfg, RunOptions(output_root=out_root, data_dir=Path(data_dir)),
                   callbacks=[RankDigest(out_root), KillRank()])


def main() -> None:
    if os.environ.get("COUNT_REDUCER_CALLS") == "1":
        record_communication()
    if sys.argv[1] == "--runs":
        runs_file, data_dir = sys.argv[2:]
        for run in json.loads(Path(runs_file).read_text()):
            run_one(run["out"], data_dir, run["experiment"], run["overrides"])
        return
    out, data_dir, name, *overrides = sys.argv[1:]
    run_one(out, data_dir, name, overrides)


if __name__ == "__main__":
    main()
