"""One trial: its run in a process of its own (one GPU, killed with the search), and what came of it."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

import sparsebert
from sparsebert.errors import SparseBertError
from sparsebert.search.metrics import metric_value
from sparsebert.search.plan import SearchPlan
from sparsebert.search.space import set_item

log = logging.getLogger(__name__)


@dataclass
class TrialProcess:
    """A trial whose process was started: what the search needs when it ends."""

    trial: optuna.Trial
    process: subprocess.Popen
    gpu: str | None  # the GPU it was given (distributed.gpus.least_used), None: it sees this process's
    log_path: Path
    run_name: str


def start_trial(trial: optuna.Trial, plan: SearchPlan, gpu: str | None) -> TrialProcess:
    """Start the trial's run as ``python -m sparsebert`` (on ``gpu`` if given); returns at once."""
    run_name = plan.run_name(trial.number)
    trial.set_user_attr("run_dir", run_name)
    log_path = plan.study_dir / "logs" / f"trial{trial.number:03d}.log"
    log_path.parent.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "sparsebert", plan.experiment, "--run-name", run_name, "--resume",
               "--output-dir", str(plan.output_root)]
    for path in plan.experiment_paths:  # the user's own experiments, beside the built-in ones the package has
        command += ["--experiments", str(path)]
    if plan.data_dir is not None:
        command += ["--data-dir", str(plan.data_dir)]
    for item in trial_sets(plan, trial.params):
        command += ["--set", item]
    log.info("trial %d%s: %s -> %s", trial.number, f" on GPU {gpu}" if gpu is not None else "",
             " ".join(set_item(k, v) for k, v in trial.params.items()), plan.output_root / run_name)
    with open(log_path, "ab") as out:  # appended: a resumed trial keeps what its interrupted process said
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=trial_env(plan, gpu),
                                   preexec_fn=_die_with_parent())
    return TrialProcess(trial, process, gpu, log_path, run_name)


def trial_sets(plan: SearchPlan, params: dict) -> list[str]:
    """The trial's ``--set`` items: the search's overrides and the trial's values, and, where trials run side by side
    (``--parallel`` > 1), ``finetune.parallel_runs=1`` unless the search sets it: the trials already share the
    GPU, so each trains its runs one at a time (the GPU fast path would otherwise start up to 4 per trial)."""
    sets = plan.trial_overrides(params)
    if plan.parallel > 1 and not any(item.startswith("finetune.parallel_runs=") for item in sets):
        sets.append("finetune.parallel_runs=1")
    return sets


def trial_env(plan: SearchPlan, gpu: str | None) -> dict[str, str]:
    """The environment of a trial process: this one's, on ``gpu`` alone if given."""
    env = dict(os.environ)
    # the trial imports this very sparsebert (run.py puts src/ on sys.path in its own process only): the same code
    # and the same built-in experiments
    package_root = str(Path(sparsebert.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if plan.parallel > 1 and "OMP_NUM_THREADS" not in env:
        # trials side by side, on CPUs or GPUs alike: each would start a thread per core for its host work, and
        # they would all fight over every core (seen on a 4-GPU machine: 24 trials ran at a fraction of one's speed)
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // plan.parallel))
    return env


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a trial is killed with its search (SIGKILL leaves no chance to stop it), so a resumed search never
    shares a run directory with an orphan of the old one. The libc handle is made before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def set_death_signal() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the search died before the signal was set
            os._exit(1)

    return set_death_signal


def finish_trial(study: optuna.Study, done: TrialProcess, plan: SearchPlan) -> str | None:
    """Tell the study how a finished trial process went.

    Returns:
        None when the trial is COMPLETE, else why it FAILed (also kept as the trial's user attr ``error``).
    """
    value, error = trial_outcome(done.process.returncode, done.log_path,
                                 plan.output_root / done.run_name / "metrics.json", plan.metric)
    if error is not None:
        done.trial.set_user_attr("error", error)
        study.tell(done.trial, state=TrialState.FAIL)
        log.warning("trial %d failed: %s (log: %s)", done.trial.number, error, done.log_path)
        return error
    study.tell(done.trial, value)
    log.info("trial %d: %s = %.4g", done.trial.number, plan.metric, value)
    return None


def trial_outcome(returncode: int, log_path: Path, metrics_path: Path,
                  metric: str) -> tuple[float | None, str | None]:
    """What a trial process that ended produced.

    Args:
        returncode: the process's exit status (negative: killed by that signal).
        log_path: everything it printed; a failure's last line says why.
        metrics_path: its run's metrics.json.
        metric: the ``--metric`` of the search.

    Returns:
        ``(value, None)``, or ``(None, why the trial failed)``.
    """
    if returncode != 0:
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        return None, f"{how}: {_last_line(log_path)}"
    try:
        value = metric_value(json.loads(metrics_path.read_text()), metric)
    except (OSError, json.JSONDecodeError) as e:
        return None, f"cannot read {metrics_path}: {e}"
    except SparseBertError as e:
        return None, f"{e} ({metrics_path})"
    if not math.isfinite(value):  # optuna would fail it too, without saying why
        return None, f"{metric} is {value} in {metrics_path}"
    return value, None


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
