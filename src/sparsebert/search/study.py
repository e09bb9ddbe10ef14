"""The study: opened once per search by its only writer, this process, which keeps the trials running."""

from __future__ import annotations

import fcntl
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from sparsebert.distributed.gpus import least_used
from sparsebert.errors import SparseBertError
from sparsebert.search.plan import DIRECTIONS, SearchPlan
from sparsebert.search.summary import write_summary
from sparsebert.search.trials import TrialProcess, finish_trial, start_trial
from sparsebert.upstream.libraries import trial_id

log = logging.getLogger(__name__)

STUDY_FILE = "study.sqlite3"
POLL_S = 0.5  # how often the running trials are checked; small next to a trial's minutes


def run_search(plan: SearchPlan, raise_if_terminated: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run trials until the study holds ``plan.trials`` complete ones (or this call's share has run).

    Args:
        plan: from :func:`plan_search`.
        raise_if_terminated: called between polls of the trials; raises when SIGTERM arrived but its handler's
            exception was swallowed (``sigterm.terminate_on_sigterm``), so no further trial starts.

    Returns:
        The summary (what summary.json holds).

    Raises:
        SparseBertError: when the study still lacks complete trials at the end (a trial failed), naming the
            first failure of this call; the summary is written first.
    """
    plan.study_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(plan.study_dir / "search.lock", plan.study):
        study = open_study(plan)
        failures = run_trials(study, plan, raise_if_terminated)
        summary = write_summary(study, plan)
    if summary["trials_complete"] < plan.trials:  # every trial of this call ran: some failed
        number, error = failures[0]
        raise SparseBertError(f"{summary['trials_complete']} of {plan.trials} trials complete; {len(failures)} "
                              f"failed in this call, first trial {number}: {error} "
                              f"(see {plan.study_dir / 'summary.md'}; the same command again runs new trials in "
                              "their place)")
    return summary


@contextmanager
def _exclusive(path: Path, study: str) -> Iterator[None]:
    """Hold a lock for the whole search: a RUNNING trial found in the study can then only be one a killed
    search left behind, which this search may take over. The lock goes with the process that holds it."""
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SparseBertError(f"another --search is running study {study} ({path} is locked); wait for it or "
                                  "pass another --study") from None
        yield


def open_study(plan: SearchPlan) -> optuna.Study:
    """Create the study, or load it after checking it was started with the same settings."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own log line per trial says what happened
    path = plan.study_dir / STUDY_FILE
    try:
        study = optuna.create_study(study_name=plan.study, storage=f"sqlite:///{path}",
                                    direction=DIRECTIONS[plan.direction], load_if_exists=True)
    except sqlalchemy.exc.DatabaseError as e:  # SQLite's own words: "file is not a database", "malformed", ...
        reason = " ".join(str(getattr(e, "orig", None) or e).split())
        raise SparseBertError(f"the study file {path} cannot be read ({reason}): it is damaged, or not an optuna "
                              "study; move it aside to start the study over (the trials' run directories stay), "
                              "or pass --study NAME for a new one") from None
    settings = json.loads(json.dumps(plan.settings()))  # as the study stores it: tuples become lists
    saved = study.user_attrs.get("settings")
    if saved is None:
        study.set_user_attr("settings", settings)
    elif saved != settings or study.direction.name.lower() != DIRECTIONS[plan.direction]:
        changed = [k for k in settings if saved.get(k) != settings[k]] or ["direction"]
        raise SparseBertError(f"study {plan.study} in {plan.study_dir} was started with another "
                              f"{', '.join(changed)}; pass --study NAME for a new study")
    # seeded (CPU searches repeat) by how many trials exist: a resumed search must not draw trial 0's values again
    study.sampler = optuna.samplers.TPESampler(seed=plan.seed + len(study.trials))
    return study


def run_trials(study: optuna.Study, plan: SearchPlan,
               raise_if_terminated: Callable[[], None]) -> list[tuple[int, str]]:
    """Keep up to ``plan.parallel`` trial processes running until this call's share of trials has run.

    Returns:
        ``(trial number, error)`` of each trial that failed in this call.
    """
    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    to_start = max(0, plan.trials - complete)
    # a killed search left these RUNNING: they run again first, in their own directories, with --resume
    orphans = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))[:to_start]
    running: list[TrialProcess] = []
    failures: list[tuple[int, str]] = []
    try:
        while to_start or running:
            while to_start and len(running) < plan.parallel:
                trial = _reopen(study, orphans.pop(0)) if orphans else study.ask(plan.distributions)
                running.append(start_trial(trial, plan, least_used(plan.gpus, [t.gpu for t in running])))
                to_start -= 1
            time.sleep(POLL_S)
            raise_if_terminated()
            for done in [t for t in running if t.process.poll() is not None]:
                running.remove(done)
                error = finish_trial(study, done, plan)
                if error:
                    failures.append((done.trial.number, error))
                write_summary(study, plan)
    finally:
        # an error here (or Ctrl-C) must not leave trials writing on without a search to record them
        for t in running:
            t.process.terminate()
        for t in running:
            t.process.wait()
    return failures


def _reopen(study: optuna.Study, frozen: FrozenTrial) -> optuna.Trial:
    log.info("trial %d was left running by an interrupted search: resuming it", frozen.number)
    return optuna.Trial(study, trial_id(frozen))
