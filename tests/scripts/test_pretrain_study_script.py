"""scripts/pretrain_study.sh on CPU at tiny size: the queue starts a KD run only after its teacher, GLUE (and the
learning-rate grid) follows each finished model, a run whose teacher never runs is skipped, and a held GPU does not
keep the script past its deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_study.sh"
TINY = ("--set model.size=tiny --set data.max_files=1 --set data.eval_documents=4 --set data.max_eval_samples=32 "
        "--set data.max_seq_length=64 --set train.global_batch_size=8 --set train.max_steps=1000 "
        "--set train.stop_after_steps=4 --set train.warmup_steps=0 --set train.eval_steps=4 "
        "--set train.torch_compile=false --set data.static_mask_count=false --set train.dataloader_workers=0")

pytestmark = pytest.mark.slow


def study(root: Path, data_dir: Path, tokenizer: str, seconds: int, **env: str) -> float:
    """Run the script; its wall time in seconds."""
    # the script calls `python`: this test's interpreter (its virtual environment's bin first)
    bin_dir = Path(sys.executable).parent
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUDY_SET": TINY, "GLUE_PARALLEL": "2",
            "GLUE_SET": "--set finetune.max_train_samples=16 --set finetune.max_eval_samples=8 --set train.epochs=1",
            "PYTHONPATH": str(SCRIPT.parents[1] / "src"), **env}
    start = time.monotonic()
    subprocess.run(["bash", str(SCRIPT), str(root), str(data_dir), tokenizer, str(seconds)], env=full,
                   cwd=SCRIPT.parents[1], check=True, capture_output=True, timeout=600)
    return time.monotonic() - start


def test_kd_after_its_teacher_and_glue_after_each_model(data_dir, minilm_path, tmp_path):
    root = tmp_path / "out"
    study(root, data_dir, minilm_path, 500, STUDY_GPUS="cpu", GLUE_GPUS="g0 g1",
          STUDY_RUNS="small_wiki_teacher small_wiki_sparse_80_kd_onecycle_lr_rigl",
          GLUE_TASKS="rte",
          GLUE_LRS="1e-4", GLUE_LR_TASKS="rte", GLUE_LR_RUNS="small_wiki_sparse_80_kd_onecycle_lr_rigl")
    logs = root / "logs"
    kd = "small_wiki_sparse_80_kd_onecycle_lr_rigl"
    exits = {p.stem: p.read_text().strip() for p in logs.glob("*.exit")}
    assert exits == {"small_wiki_teacher": "0", kd: "0", f"glue_from={kd}~rte": "0", f"glue_from={kd}~rte~lr1e-4": "0"}
    # the KD run started once its teacher was done (one worker, but the queue lists it second either way)
    assert (root / "small_wiki_teacher" / "DONE").stat().st_mtime <= (logs / f"{kd}.started").stat().st_mtime
    # GLUE from the KD model only (the teacher is no model of the study), at the default rate and at the grid's
    configs = {p.parents[2].name: json.loads(p.read_text())["train"]["learning_rate"]
               for p in root.glob("glue_from=*/glue_rte/run*/config.json")}
    assert configs == {f"glue_from={kd}~rte": 5e-5, f"glue_from={kd}~rte~lr1e-4": 1e-4}


def test_a_missing_teacher_skips_its_student_and_a_hold_ends_at_the_deadline(data_dir, minilm_path, tmp_path):
    root = tmp_path / "out"
    (root / "hold").mkdir(parents=True)
    (root / "hold" / "held").touch()  # a benchmark that never gives this GPU back
    wall = study(root, data_dir, minilm_path, 8, STUDY_GPUS="cpu held",
                 STUDY_RUNS="small_wiki_sparse_80_kd_onecycle_lr_rigl", GLUE_TASKS="rte", GLUE_LRS="")
    log = (root / "logs" / "small_wiki_sparse_80_kd_onecycle_lr_rigl.log").read_text()
    assert log.startswith("not run: it needs small_wiki_teacher")
    assert not list(root.glob("glue_from=*"))  # no GLUE from a model that was never made
    assert wall < 30  # the held GPU's worker stops at the 8 s deadline


def test_study_runs_over_several_lines_and_an_unknown_name(tmp_path):
    """STUDY_RUNS written over several lines keeps every run; a name the script does not hold stops it before
    anything starts, with a one-line error."""
    env = {**os.environ, "STUDY_GPUS": "cpu"}
    bad = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "bad"), "DATA", "TOK", "5"], capture_output=True,
                         text=True, env={**env, "STUDY_RUNS": "small_wiki_teacher\nsmall_wiki_tacher"}, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "pretrain_study.sh: STUDY_RUNS names an unknown run: small_wiki_tacher"
    assert not (tmp_path / "bad" / "queue").exists()
    # the queue of a multi-line list, in its order, each run once (the workers fail at once here: no python data;
    # the queue file is what counts)
    root = tmp_path / "ok"
    (root / "hold").mkdir(parents=True)
    (root / "hold" / "cpu").touch()  # the one worker waits, so the queue stays as the script wrote it
    runs = "numerics_fast_seed43\n  ablation_rigl_eager small_wiki_sparse_80_gmp\nsmall_wiki_teacher numerics_fast_seed43\n"
    subprocess.run(["bash", str(SCRIPT), str(root), "DATA", "TOK", "3"], capture_output=True, timeout=60,
                   env={**env, "STUDY_RUNS": runs})
    queue = [line.split("|") for line in (root / "queue").read_text().splitlines()]
    assert [name for name, _, _ in queue] == ["numerics_fast_seed43", "ablation_rigl_eager", "small_wiki_sparse_80_gmp",
                                              "small_wiki_teacher"]
    assert queue[0][2].split() == ["bert_small_wiki", "--set", "seed=43"]  # a seed variant is its parent + --set
    assert queue[1][2].split()[-2:] == ["--set", "train.clip_in_optimizer=false"]  # a run written over two lines
    # GLUE jobs for the study's models only: none for the teacher, an ablation or a numerics run
    assert sorted(p.name for p in (root / "glue_jobs").iterdir()) == ["small_wiki_sparse_80_gmp"]


def test_the_fp8_pair_is_its_bf16_runs_with_fp8_and_each_gets_glue(tmp_path):
    root = tmp_path / "fp8"
    (root / "hold").mkdir(parents=True)
    (root / "hold" / "cpu").touch()  # the one worker waits: the queue stays as the script wrote it
    pair = "small_wiki_teacher bert_small_wiki fp8pair_dense_seed43 fp8pair_dense_fp8 fp8pair_dense_fp8_seed43 " \
           "kd_hidden_gmp_global kd_hidden_gmp_global_seed43 fp8pair_sparse_fp8 fp8pair_sparse_fp8_seed43 " \
           "small_wiki_sparse_80_gmp fp8pair_gmp_seed43 fp8pair_gmp_fp8 fp8pair_gmp_fp8_seed43"
    subprocess.run(["bash", str(SCRIPT), str(root), "DATA", "TOK", "3"], capture_output=True, timeout=60,
                   env={**os.environ, "STUDY_GPUS": "cpu", "STUDY_RUNS": pair})
    queue = {name: (needs, args.split()) for name, needs, args in
             (line.split("|") for line in (root / "queue").read_text().splitlines())}
    fp8 = ["--set", "train.precision=fp8"]
    for bf16, with_fp8 in (("bert_small_wiki", "fp8pair_dense_fp8"), ("fp8pair_dense_seed43", "fp8pair_dense_fp8_seed43"),
                           ("kd_hidden_gmp_global", "fp8pair_sparse_fp8"),
                           ("kd_hidden_gmp_global_seed43", "fp8pair_sparse_fp8_seed43"),
                           ("small_wiki_sparse_80_gmp", "fp8pair_gmp_fp8"),
                           ("fp8pair_gmp_seed43", "fp8pair_gmp_fp8_seed43")):
        assert queue[with_fp8] == (queue[bf16][0], queue[bf16][1] + fp8), with_fp8
    # every model of the pair gets GLUE (the teacher does not)
    assert sorted(p.name for p in (root / "glue_jobs").iterdir()) == sorted(pair.split()[1:])


def test_glue_runs_on_half_the_cpus_although_the_script_sets_omp_num_threads(tmp_path):
    """GNU nproc counts only OMP_NUM_THREADS CPUs, and the script exports OMP_NUM_THREADS=1 for its processes: the
    default GLUE pool must count the machine's CPUs, not that one (a 16-CPU lease ran its GLUE one at a time)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nproc = bin_dir / "nproc"  # a 16-CPU machine's nproc, OMP_NUM_THREADS honoured as coreutils does
    nproc.write_text('#!/bin/sh\necho "${OMP_THREAD_LIMIT:-${OMP_NUM_THREADS:-16}}"\n')
    nproc.chmod(0o755)
    root = tmp_path / "out"
    (root / "hold").mkdir(parents=True)
    (root / "hold" / "cpu").touch()  # the worker waits: the pool's size is what counts
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUDY_GPUS": "cpu",
           "STUDY_RUNS": "small_wiki_teacher", "OMP_NUM_THREADS": "1"}
    env.pop("GLUE_PARALLEL", None)
    out = subprocess.run(["bash", str(SCRIPT), str(root), "DATA", "TOK", "2"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert "GLUE 8 processes at a time" in out.stdout

