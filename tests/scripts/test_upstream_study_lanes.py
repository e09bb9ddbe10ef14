"""scripts/upstream_study.sh's lane limit, with a stand-in ``python`` that records when each lane's run.py starts
and ends (seconds, not a training run): STUDY_MAX_LANES bounds how many lanes of a GPU run at once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upstream_study.sh"


def run_study(tmp_path: Path, **env: str) -> list[tuple[float, float]]:
    """Runs the study with four dense lanes (one per GLUE task) on one GPU; returns each lane's (start, end)."""
    bin_dir, events = tmp_path / "bin", tmp_path / "events"
    bin_dir.mkdir()
    stand_in = bin_dir / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "start $$ $(date +%s.%N)" >> {events}\nsleep 1\n'
                        f'echo "end $$ $(date +%s.%N)" >> {events}\n')
    stand_in.chmod(0o755)
    subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), str(tmp_path), "minilm", "60"],
                   env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUDY_GPUS": "0",
                        "STUDY_UPSTREAM": " ", "STUDY_TASKS": "rte mrpc stsb cola", "STUDY_DOWNSTREAM": "", **env},
                   check=True, capture_output=True, timeout=60)
    times: dict[str, list[float]] = {}
    for line in events.read_text().splitlines():
        _, pid, at = line.split()
        times.setdefault(pid, []).append(float(at))
    return [(start, end) for start, end in times.values()]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    return max(sum(start <= at < end for start, end in spans) for at, _ in spans)


def test_max_lanes_bounds_the_lanes_running_on_a_gpu(tmp_path):
    spans = run_study(tmp_path, STUDY_MAX_LANES="2")
    assert len(spans) == 4 and most_at_once(spans) == 2


def test_without_a_limit_every_lane_starts_at_once(tmp_path):
    assert most_at_once(run_study(tmp_path)) == 4
