"""scripts/upstream_study.sh's lanes, with a stand-in ``python`` that records each run.py it is asked to start (its
arguments, when it starts and ends; it trains nothing): the lane limit, and which lanes a setting adds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upstream_study.sh"


def run_study(tmp_path: Path, hold: int = 3, gpu_mib: int | None = None,
              **env: str) -> dict[str, tuple[float, float, str]]:
    """Runs the study (one GPU, no upstream run, no downstream recipe unless ``env`` says so); each stand-in run.py
    lasts ``hold`` seconds. A stand-in nvidia-smi reports a GPU of ``gpu_mib`` MiB, or fails as on a machine whose
    driver does not answer (None).

    Returns:
        Per stand-in process: (start, end, its arguments).
    """
    bin_dir, events = tmp_path / "bin", tmp_path / "events"
    bin_dir.mkdir(parents=True, exist_ok=True)
    stand_in = bin_dir / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "start $$ $(date +%s.%N) $*" >> {events}\nsleep {hold}\n'
                        f'echo "end $$ $(date +%s.%N)" >> {events}\n')
    stand_in.chmod(0o755)
    answer = f"echo {gpu_mib}" if gpu_mib is not None else "echo 'NVIDIA-SMI has failed'; exit 9"
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n{answer}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), str(tmp_path), "minilm", "60"],
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("STUDY_")},
                        "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUDY_GPUS": "0",
                        "STUDY_UPSTREAM": " ", "STUDY_DOWNSTREAM": "", **env},
                   check=True, capture_output=True, timeout=60)
    runs: dict[str, list] = {}
    for line in events.read_text().splitlines():
        what, pid, at, *args = line.split(maxsplit=3)
        runs.setdefault(pid, [0.0, 0.0, ""])
        if what == "start":
            runs[pid][0], runs[pid][2] = float(at), " ".join(args)
        else:
            runs[pid][1] = float(at)
    return {pid: tuple(run) for pid, run in runs.items()}


def most_at_once(runs: dict[str, tuple[float, float, str]]) -> int:
    spans = [(start, end) for start, end, _ in runs.values()]
    return max(sum(start <= at < end for start, end in spans) for at, _ in spans)


def test_max_lanes_bounds_the_lanes_running_on_a_gpu(tmp_path):
    runs = run_study(tmp_path, STUDY_TASKS="rte mrpc stsb cola", STUDY_MAX_LANES="2")
    assert len(runs) == 4 and most_at_once(runs) == 2


def test_without_a_limit_every_lane_starts_at_once(tmp_path):
    """A limit of 0, and no default where nvidia-smi does not answer."""
    assert most_at_once(run_study(tmp_path, gpu_mib=4000, STUDY_TASKS="rte mrpc stsb cola", STUDY_MAX_LANES="0")) == 4
    assert most_at_once(run_study(tmp_path / "failing_smi", STUDY_TASKS="rte mrpc stsb cola")) == 4


def test_the_default_limit_is_what_the_gpu_memory_holds_at_3_gib_a_lane(tmp_path):
    runs = run_study(tmp_path, gpu_mib=6 * 1024 + 100, STUDY_TASKS="rte mrpc stsb cola")
    assert len(runs) == 4 and most_at_once(runs) == 2


def test_the_default_limit_gives_downstream_obert_lanes_5_gib(tmp_path):
    """Their Fisher inverses take 2 GiB beside the run (RTE's teacher has finished: its downstream lane runs)."""
    teacher_done = tmp_path / "out" / "rte" / "minilm_glue" / "glue_rte" / "run0" / "DONE"
    teacher_done.parent.mkdir(parents=True)
    teacher_done.touch()
    runs = run_study(tmp_path, gpu_mib=10 * 1024 + 100, STUDY_TASKS="rte mrpc stsb cola", STUDY_DOWNSTREAM="rte",
                     STUDY_DOWNSTREAM_VARIANTS="_downstream80_obs")
    assert len(runs) == 5 and most_at_once(runs) == 2


def test_every_lane_resumes_what_an_earlier_invocation_left(tmp_path):
    """The same command again into the same root continues stopped runs instead of refusing them, and each lane's
    log keeps what the first invocation wrote."""
    runs = run_study(tmp_path, hold=0, STUDY_TASKS="rte gap_mul")
    assert len(runs) == 2
    assert all(args.startswith("run.py --resume ") for _, _, args in runs.values())
    log = tmp_path / "out" / "logs" / "rte-dense.log"
    log.write_text("the first invocation's lines\n")
    (tmp_path / "events").unlink()
    run_study(tmp_path, hold=0, STUDY_TASKS="rte")
    assert log.read_text().startswith("the first invocation's lines\n")


def test_a_transfer_variant_is_a_lane_per_seed_from_the_first_upstream_model_and_the_teacher(tmp_path):
    """STUDY_VARIANTS with STUDY_SEED_LANES: each variant of the first upstream run's transfer trains each seed in a
    process of its own, from that model, distilled from the task's dense run (all finished here already); the
    other upstream run gets its plain transfer only."""
    out = tmp_path / "out"
    upstream = out / "upstream" / "minilm_upstream_sparse80_obs_nodropout"
    teacher = out / "rte" / "minilm_glue"
    for done in (upstream / "DONE", out / "upstream" / "minilm_upstream_sparse90_obs" / "DONE",
                 teacher / "glue_rte" / "run0" / "DONE"):
        done.parent.mkdir(parents=True)
        done.touch()
    runs = run_study(tmp_path, hold=0, STUDY_UPSTREAM="80_obs_nodropout 90_obs", STUDY_TASKS="rte",
                     STUDY_VARIANTS="_searched", STUDY_SEED_LANES="1")
    experiments = [args.split()[2] for _, _, args in runs.values()]
    assert sorted(set(experiments)) == ["minilm_glue", "minilm_glue_from_upstream80_obs_nodropout",
                                        "minilm_glue_from_upstream80_obs_nodropout_searched",
                                        "minilm_glue_from_upstream90_obs", "minilm_upstream_sparse80_obs_nodropout",
                                        "minilm_upstream_sparse90_obs"]
    searched = sorted(args for _, _, args in runs.values() if "_searched " in args)
    assert len(searched) == 3
    for seed, args in zip((42, 43, 44), searched, strict=True):
        assert f"--output-dir {out}/rte/seed{seed} " in args and f"--set seed={seed} " in args
        assert f"--set model.init_from={upstream}" in args and f"--set kd.teacher={teacher}" in args


def test_a_lane_limit_that_is_not_a_whole_number_is_refused_before_any_lane(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), str(tmp_path), "minilm", "60"],
                          env={**os.environ, "STUDY_MAX_LANES": "08", "STUDY_GPUS": "0"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "upstream_study.sh: STUDY_MAX_LANES must be a whole number (0: no limit), got '08'"
    assert not (tmp_path / "out" / "logs").exists()
