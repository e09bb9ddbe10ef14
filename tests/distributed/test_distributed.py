"""Multi-process training on CPU (gloo) through torchrun, as on GPUs but with processes for devices.

- 2 processes: every rank ends with identical weights and masks, also when sparsebert's flat all-reduce replaces
  DDP's reducer (train.ddp.comm_hook=flat, or sparse, which sends only the gradients of active weights: the same
  model as plain DDP, bit for bit; flat_bf16, rounded to bf16 on the wire: the ranks agree); the eval-loss
  trajectory matches a 1-process run with the same global batch within 0.05 nats (masks are drawn per device
  batch, so they differ in detail);
- 2 "nodes" on localhost with 1 and 2 processes (uneven) rendezvous, finish and agree;
- a rank killed mid-run makes the whole job exit non-zero within 60 s;
- `accelerate launch` with the CPU config (and --multi_gpu: torchrun, not mpirun) runs 2 ranks to the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = str(REPO / "tests/helpers/ddp_worker.py")
pytestmark = pytest.mark.slow

FAST = ["data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=32", "data.max_seq_length=64",
        "train.global_batch_size=12", "train.max_steps=12", "train.eval_steps=6", "train.save_steps=6",
        "train.logging_steps=2", "train.report_to=[]", "train.dataloader_workers=0"]
SPARSE = [*FAST, "rigl.update_freq=3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"), **extra}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def ranks(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_two_ranks_identical_and_trajectory_matches_one_process(data_dir, tmp_path, ddp_runs):
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.run([sys.executable, WORKER, str(one), str(data_dir), "sparse_tiny_rigl", *SPARSE],
                            env=env_for(tmp_path), capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    cmd = torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   WORKER, str(two), str(data_dir), "sparse_tiny_rigl", *SPARSE)
    done = subprocess.run(cmd, env=env_for(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = ranks(two, 2)
    assert r0["world"] == r1["world"] == 2
    assert r0["zeros"] == r1["zeros"]  # the same masks after 2 RigL updates (steps 3 and 6)
    assert r0["weights"] == r1["weights"]  # and the same weights, bit for bit
    # the same plain DDP run, trained last in DDP_RUNS' launch after 7 other runs in the same processes (and with
    # the worker's counting comm hook, which averages as DDP's reducer does): the same weights, masks and losses,
    # so running the tests' runs one after the other in one launch trains each as a launch of its own would
    combined = ddp_runs[1]["acc1_none"]
    for alone, after_others in zip((r0, r1), combined):
        assert {k: alone[k] for k in ("weights", "zeros", "losses", "eval_losses")} == \
            {k: after_others[k] for k in ("weights", "zeros", "losses", "eval_losses")}
    run = two / "sparse_tiny_rigl"
    assert json.loads((run / "checkpoint-12" / "sparsity_state.json").read_text())["step"] == 12
    history = json.loads((run / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    assert any("rigl/drop_fraction" in h for h in history)  # RigL did update under DDP
    assert json.loads((run / "metrics.json").read_text())["sparsity"] == pytest.approx(0.8, abs=1e-4)
    (base,) = ranks(one, 1)
    assert base["world"] == 1 and len(base["eval_losses"]) == len(r0["eval_losses"]) == 3
    for a, b in zip(base["eval_losses"], r0["eval_losses"]):
        assert a == pytest.approx(b, abs=0.05)


def two_rank_runs(data_dir: Path, tmp_path: Path, runs: dict[str, tuple[str, list[str]]]) -> dict[str, list[dict]]:
    """Each run (name -> experiment, overrides) on 2 processes, one after the other in one torchrun launch (the
    launch and the workers' imports cost more than a tiny run; the worker zeroes its counters per run and every
    run is seeded as it starts): both ranks' digests."""
    spec = [{"out": str(tmp_path / name), "experiment": experiment,
             "overrides": [*(SPARSE if experiment == "sparse_tiny_rigl" else FAST), *overrides]}
            for name, (experiment, overrides) in runs.items()]
    (tmp_path / "runs.json").write_text(json.dumps(spec))
    cmd = torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   WORKER, "--runs", str(tmp_path / "runs.json"), str(data_dir))
    done = subprocess.run(cmd, env=env_for(tmp_path, COUNT_REDUCER_CALLS="1"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: ranks(tmp_path / name, 2) for name in runs}


FUSED_CLIP = ["train.optim=adamw_torch_fused", "train.max_grad_norm=0.05"]
# gradual pruning by the oBERT score: prunes at steps 3, 6, 9, each with the Fisher of the 3 steps before it
OBS = ["sparsity.sparsity=0.8", "sparsity.init=magnitude", "gmp.score=obs", "gmp.frequency=3", "gmp.end_step=9",
       "gmp.obs_num_grads=3", "gmp.obs_block_size=16", "gmp.global_ranking=true"]
# The 2-process runs of the tests below, trained in one launch. Plain DDP at 1 micro-batch per step ("acc1_none")
# comes last: test_two_ranks_identical_and_trajectory_matches_one_process checks it bit for bit against a launch
# of its own, so the runs before it in the same processes changed nothing.
DDP_RUNS: dict[str, tuple[str, list[str]]] = {
    "clip_sparse": ("sparse_tiny_rigl", [*FUSED_CLIP, "train.ddp.comm_hook=sparse"]),
    "clip_flat_bf16": ("bert_tiny_quick", [*FUSED_CLIP, "train.ddp.comm_hook=flat_bf16",
                                           "train.per_device_batch_size=3"]),
    **{f"acc2_{hook}": ("sparse_tiny_rigl", [f"train.ddp.comm_hook={hook}", "train.per_device_batch_size=3"])
       for hook in ("none", "sparse")},
    **{f"obs_acc2_{hook}": ("bert_tiny_quick", [*OBS, f"train.ddp.comm_hook={hook}", "train.per_device_batch_size=3"])
       for hook in ("none", "sparse")},
    **{f"acc1_{hook}": ("sparse_tiny_rigl", [f"train.ddp.comm_hook={hook}", "train.per_device_batch_size=6"])
       for hook in ("sparse", "flat", "flat_bf16", "none")},
}


@pytest.fixture(scope="module")
def ddp_runs(data_dir, tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """The output root of DDP_RUNS and each run's digests (both ranks)."""
    out = tmp_path_factory.mktemp("ddp_runs")
    return out, two_rank_runs(data_dir, out, DDP_RUNS)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_flat_all_reduces_train_the_same_model_bit_for_bit(ddp_runs, accumulation):
    """train.ddp.comm_hook=flat averages every gradient, and sparse only active weights' gradients (dense ones on
    RigL steps), in one all-reduce after the last micro-batch, without DDP's reducer: the weights and masks after
    12 steps with 2 RigL updates are those of plain DDP, bit for bit, with fewer values sent by sparse; flat_bf16
    sends bf16 values, and its ranks agree. The flat all-reduces run in 3 pieces (the default; one piece is
    checked against plain DDP on a toy model in tests/distributed/test_all_reduce.py). With 2
    micro-batches per step (the sync after the last one) sparse alone: the other hooks share its code after the
    backward."""
    hooks = ("none", "sparse", "flat", "flat_bf16") if accumulation == 1 else ("none", "sparse")
    out, all_digests = ddp_runs
    digests = {hook: all_digests[f"acc{accumulation}_{hook}"] for hook in hooks}
    plain = digests["none"][0]
    # DDP's reducer averaged plain DDP's gradients, and none of the flat runs' (averaging twice would give the
    # same bits at 2 ranks, so the weights alone cannot tell)
    assert plain["reducer_calls"] > 0
    for hook in (h for h in ("sparse", "flat") if h in digests):
        rank0, rank1 = digests[hook]
        assert rank0["reducer_calls"] == 0, hook
        assert rank1["weights"] == rank0["weights"], hook  # both ranks agree
        assert rank0["weights"] == plain["weights"] and rank0["zeros"] == plain["zeros"], hook
        assert rank0["losses"] == plain["losses"], hook
    if accumulation == 1:
        rank0, rank1 = digests["flat_bf16"]
        assert rank0["reducer_calls"] == 0 and rank1["weights"] == rank0["weights"]
        assert "torch.bfloat16" in rank0["all_reduce_dtypes"] and "torch.bfloat16" not in plain["all_reduce_dtypes"]
        assert rank0["losses"] == pytest.approx(plain["losses"], abs=0.02)  # rounded averages, the same course
    history = json.loads((out / f"acc{accumulation}_sparse/sparse_tiny_rigl/checkpoint-12/trainer_state.json")
                         .read_text())
    sent = [h["ddp/allreduce_sent_fraction"] for h in history["log_history"] if "ddp/allreduce_sent_fraction" in h]
    assert sent and all(0.5 < f < 1 for f in sent)  # the tiny model's dense embeddings are most of its weights


def test_obs_scores_the_synced_gradients_of_the_whole_step(ddp_runs):
    """gmp.score=obs under DDP with 2 micro-batches per step: the Fisher takes each step's gradient once, after
    the sync (DDP's reducer, or the sparse all-reduce after the last micro-batch), so both ranks prune the same
    weights and the two syncs train the same model, bit for bit. A rank scoring its own unsynced gradients would
    prune otherwise than its peer."""
    out, all_digests = ddp_runs
    plain, sparse = all_digests["obs_acc2_none"], all_digests["obs_acc2_sparse"]
    for rank0, rank1 in (plain, sparse):
        assert rank1["weights"] == rank0["weights"] and rank1["zeros"] == rank0["zeros"]
    assert sparse[0]["reducer_calls"] == 0 < plain[0]["reducer_calls"]
    assert sparse[0]["weights"] == plain[0]["weights"] and sparse[0]["zeros"] == plain[0]["zeros"]
    metrics = json.loads((out / "obs_acc2_sparse" / "bert_tiny_quick" / "metrics.json").read_text())
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)


def test_two_nodes_with_uneven_processes(data_dir, tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "uneven"]
    rest = [WORKER, str(tmp_path), str(data_dir), "bert_tiny_quick", *FAST]
    nodes = [subprocess.Popen(torchrun(*common, "--nproc-per-node", str(n), *rest), env=env_for(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (1, 2)]
    outputs = [p.communicate(timeout=600) for p in nodes]
    for p, (_, err) in zip(nodes, outputs):
        assert p.returncode == 0, err[-3000:]
    digests = ranks(tmp_path, 3)
    assert {d["world"] for d in digests} == {3}
    assert digests[0]["weights"] == digests[1]["weights"] == digests[2]["weights"]
    assert (tmp_path / "bert_tiny_quick" / "DONE").is_file()


def test_a_killed_rank_ends_the_job_quickly(data_dir, tmp_path):
    cmd = torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   WORKER, str(tmp_path), str(data_dir), "bert_tiny_quick", *FAST)
    start = time.monotonic()
    done = subprocess.run(cmd, env=env_for(tmp_path, KILL_RANK="1", KILL_STEP="4"), capture_output=True,
                          text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s to notice a dead rank"
    assert not (tmp_path / "bert_tiny_quick" / "DONE").exists()


def test_unreachable_main_node_times_out_naming_the_address(tmp_path):
    port = free_port()  # nothing listens there: a main node that never came up
    cmd = torchrun("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                   "--master-port", str(port), "--rdzv-conf", "timeout=5", str(REPO / "run.py"), "--list")
    start = time.monotonic()
    done = subprocess.run(cmd, env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - start < 60
    assert f"(127.0.0.1, {port})" in done.stderr and "timed out" in done.stderr


def test_one_main_process_per_job_on_cpu_and_mpirun_sizes(tmp_path):
    """Without CUDA, Accelerate must still see one gloo job (one main process, working barriers), or featurizing
    once per node and main-process-only writes would gate nothing; mpirun's size variables count too."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(REPO / 'src')!r})\n"
        "from sparsebert.distributed import process_state, world_size\n"
        "s = process_state()\n"
        "with s.local_main_process_first():\n"
        "    order = os.path.getsize(sys.argv[1]) if os.path.exists(sys.argv[1]) else 0\n"
        "    open(sys.argv[1], 'a').write(str(s.process_index))\n"
        "json.dump({'type': str(s.distributed_type), 'main': s.is_main_process, 'n': s.num_processes,\n"
        "           'world': world_size(), 'order': order}, open(f'{sys.argv[1]}.{s.process_index}', 'w'))\n")
    done = subprocess.run(torchrun("--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                                   str(tmp_path / "log")), env=env_for(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = [json.loads((tmp_path / f"log.{r}").read_text()) for r in range(2)]
    assert [g["main"] for g in got] == [True, False] and all(g["n"] == g["world"] == 2 for g in got)
    assert "MULTI_CPU" in got[0]["type"]
    assert (tmp_path / "log").read_text() == "01"  # the main process went first, the other waited for it
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    probe = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'src')!r}); "
             "from sparsebert.distributed import world_size; print(world_size())"]
    assert subprocess.run(probe, env={**env, "OMPI_COMM_WORLD_SIZE": "3"}, capture_output=True,
                          text=True).stdout.strip() == "3"


def test_clipping_inside_fused_adamw_takes_the_norm_from_the_flat_all_reduces(ddp_runs):
    """train.clip_in_optimizer with a fused AdamW (as on GPUs) under comm_hook=sparse (sparse_tiny_rigl) and
    flat_bf16 (the dense bert_tiny_quick, 2 micro-batches per step): the clipped norm is the one the all-reduce
    summed piece by piece, equal to the Trainer's norm of the same gradients; sparse takes it on steps that sent
    active values only and the Trainer's own on RigL steps (dense gradients, masked afterwards); at a clip (0.05)
    every step hits. (That clipping inside the fused step updates as the Trainer's clipping does:
    tests/trainer/test_clip_in_optimizer.py.)"""
    _, digests = ddp_runs
    rank0, rank1 = digests["clip_sparse"]
    assert rank1["weights"] == rank0["weights"] and rank1["zeros"] == rank0["zeros"]
    # of 12 steps, the first (the all-reduce learns that it is asked) and RigL's 2 dense-gradient steps (3 and 6;
    # RigL's updates end at 75 % of the run) use the Trainer's norm
    assert rank0["norms_from_all_reduce"] == 12 - 1 - 2
    bf16_rank0, bf16_rank1 = digests["clip_flat_bf16"]
    assert bf16_rank0["norms_from_all_reduce"] == 12 - 1 and bf16_rank1["weights"] == bf16_rank0["weights"]
    # the norm of the gradients the optimizer sees: a float32 sum of squares over the tiny BERT's 4.4 M values on
    # a CPU is off by ~1e-4 (the Trainer's own norm as much), while a piece left out would be off by percents
    assert max(rank0["norm_errors"] + bf16_rank0["norm_errors"]) < 5e-4
    assert min(rank0["grad_norms"] + bf16_rank0["grad_norms"]) > 0.05


def test_accelerate_launch_starts_two_gloo_processes_without_mpi(data_dir, tmp_path):
    """``accelerate launch`` with the CPU config and no other flag starts the 2 processes it names (Accelerate's
    MULTI_CPU type would start one without mpirun, silently: the config has it start them through torchrun, which
    on CPU is a gloo job). The tiny sparse run finishes on 2 ranks: DONE, a world of 2, the masks' 80 % reached,
    and the INFO lines, the finished line among them, once (rank 0's)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(REPO / "configs/accelerate/cpu_multi_process.yaml"),
           "--main_process_port", str(free_port()),
           str(REPO / "run.py"), "sparse_tiny_rigl", "--output-dir", str(out), "--data-dir", str(data_dir),
           *(f"--set={o}" for o in [*SPARSE, "train.max_steps=6", "train.eval_steps=3", "train.save_steps=6"])]
    done = subprocess.run(cmd, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = out / "sparse_tiny_rigl"
    assert (run / "DONE").is_file()
    assert json.loads((run / "env.json").read_text())["hardware"]["world_size"] == 2
    assert json.loads((run / "metrics.json").read_text())["sparsity"] == pytest.approx(0.8, abs=1e-4)
    assert json.loads((run / "checkpoint-6" / "sparsity_state.json").read_text())["step"] == 6
    assert done.stderr.count("sparse_tiny_rigl finished:") == 1
    assert done.stderr.count("INFO sparsebert: running sparse_tiny_rigl") == 1  # rank 1 logs warnings only
