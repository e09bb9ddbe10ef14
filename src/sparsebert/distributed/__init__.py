"""Multi-process training: this process's place in the job (here, for code that runs before the Trainer exists),
the GPU choice of ``--gpus`` (``gpus``) and the flat / sparse all-reduce that replaces DDP's reducer (``all_reduce``).
"""

from __future__ import annotations

import os

# launchers and the variable each sets to the number of processes: torchrun / accelerate launch, then mpirun
# (Intel MPI / MPICH, Open MPI, MVAPICH), which Accelerate's CPU multi-process mode also accepts
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def world_size() -> int:
    """Processes in this job (set by the launcher before Python starts)."""
    for name in WORLD_SIZE_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


# and the variable each sets to this process's rank in the job
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


def global_rank() -> int:
    """This process's rank in the job (0 outside a launcher), from the launcher's environment: known before
    Python's logging is set up, unlike Accelerate's state."""
    for name in RANK_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def process_state():
    """Accelerate's PartialState, with ``cpu=True`` on a machine without CUDA: otherwise a gloo job of N
    processes reports itself as N separate single-process runs, every rank its own main process, and
    "featurize once per node" or "write from the main process only" would gate nothing."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())
