"""summary.json and summary.md: the study as plain data and as a short report."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from sparsebert.io import atomic_write_json, atomic_write_text
from sparsebert.search.plan import SearchPlan


def summarize(study: optuna.Study, plan: SearchPlan) -> dict[str, Any]:
    """The study as plain data: the best trial, its ``--set`` items and command line, and every trial."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    return {
        "study": plan.study, "experiment": plan.experiment, "space": plan.space, "metric": plan.metric,
        "direction": plan.direction, "output_root": str(plan.output_root), "trials_requested": plan.trials,
        "trials_complete": len(complete),
        "best_trial": best.number if best else None,
        "best_value": best.value if best else None,
        "best_overrides": plan.trial_overrides(best.params) if best else None,
        "best_command": plan.command_line(best.params) if best else None,
        "trials": [
            {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
             "run_dir": t.user_attrs.get("run_dir"),  # under the output root, as --plot --experiments names runs
             "duration_s": t.duration.total_seconds() if t.duration else None,
             "error": t.user_attrs.get("error")}
            for t in trials
        ],
    }


def write_summary(study: optuna.Study, plan: SearchPlan) -> dict[str, Any]:
    """Write summary.json and summary.md (atomically: a reader never sees half of one); returns the summary."""
    summary = summarize(study, plan)
    atomic_write_json(plan.study_dir / "summary.json", summary)
    atomic_write_text(plan.study_dir / "summary.md", summary_markdown(summary, list(plan.distributions)))
    return summary


def summary_markdown(summary: dict[str, Any], keys: list[str]) -> str:
    """A short report: the best trial and its command line, then every trial, best first."""
    lines = [f"# Search {summary['study']}", "",
             f"Experiment `{summary['experiment']}`, space `{summary['space']}`, metric `{summary['metric']}` "
             f"({summary['direction']}): {summary['trials_complete']} of {summary['trials_requested']} trials "
             "complete.", ""]
    if summary["best_trial"] is not None:
        lines += [f"Best: trial {summary['best_trial']}, {summary['metric']} = {summary['best_value']:.4g}", "",
                  "```", summary["best_command"], "```", ""]
    sign = -1 if summary["direction"] == "max" else 1
    rows = sorted(summary["trials"], key=lambda t: (t["value"] is None, sign * (t["value"] or 0), t["number"]))
    lines += ["| trial | state | " + " | ".join([summary["metric"], *keys, "duration", "run"]) + " |",
              "|" + "---|" * (5 + len(keys))]
    for t in rows:
        cells = [str(t["number"]), t["state"], _cell(t["value"]), *(_cell(t["params"].get(k)) for k in keys),
                 f"{t['duration_s']:.0f} s" if t["duration_s"] is not None else "-", t["run_dir"] or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [t for t in summary["trials"] if t["error"]]
    if failed:
        lines += ["", *(f"- trial {t['number']} failed: {t['error']}" for t in failed)]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
