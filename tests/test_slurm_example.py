"""examples/slurm/sparse_pretrain.sbatch, outside Slurm: fake SLURM_* variables and stub scontrol/srun on PATH.
The torchrun it starts on every node: all nodes of the job, rendezvous on the first node, the job id as the
rendezvous id, and run.py with the experiment."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples/slurm/sparse_pretrain.sbatch"


@pytest.fixture
def slurm(tmp_path):
    """Run the script as Slurm would on the first node: stub scontrol (3 hosts) and srun (writes its arguments,
    one per line, to srun.args) first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"scontrol": '[ "$*" = "show hostnames gpu[07-09]" ] || exit 3\nprintf "gpu07\\ngpu08\\ngpu09\\n"\n',
             "srun": f'printf "%s\\n" "$@" > {tmp_path}/srun.args\n'}
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPUS_PER_NODE", "RDZV_PORT"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SLURM_JOB_NODELIST="gpu[07-09]", SLURM_NNODES="3",
               SLURM_JOB_ID="4242", SLURM_GPUS_ON_NODE="4")

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", str(SCRIPT), *args], env={**env, **extra}, cwd=REPO, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done

    return run, tmp_path


def srun_call(tmp_path: Path) -> list[str]:
    return ["srun", *(tmp_path / "srun.args").read_text().splitlines()]


def torchrun_args(cmd: list[str]) -> list[str]:
    """The arguments after ``python -m torch.distributed.run`` in srun's command line, checking srun's part."""
    assert cmd[:7] == ["srun", "--nodes", "3", "--ntasks-per-node", "1", "--kill-on-bad-exit=1", "python"]
    assert cmd[7:9] == ["-m", "torch.distributed.run"]
    return cmd[9:]


EXPECTED = ["--nnodes", "3", "--nproc-per-node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu07:29500",
            "--rdzv-id", "4242", "run.py", "sparse_80_rigl"]


def test_dry_run_prints_one_torchrun_per_node(slurm):
    run, _ = slurm
    done = run(SPARSEBERT_DRY_RUN="1")
    assert torchrun_args(shlex.split(done.stdout)) == EXPECTED


def test_runs_srun_with_the_same_command_and_passes_arguments(slurm):
    run, tmp_path = slurm
    run()
    assert torchrun_args(srun_call(tmp_path)) == EXPECTED
    # other arguments replace the experiment; GPUS_PER_NODE and RDZV_PORT override Slurm's count and the port
    run("sparse_80_rigl", "train.max_steps=10", "--output-dir", "/scratch/my runs", GPUS_PER_NODE="8",
        RDZV_PORT="29600")
    args = torchrun_args(srun_call(tmp_path))
    assert args[:8] == ["--nnodes", "3", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        "gpu07:29600"]
    assert args[-5:] == ["run.py", "sparse_80_rigl", "train.max_steps=10", "--output-dir", "/scratch/my runs"]
