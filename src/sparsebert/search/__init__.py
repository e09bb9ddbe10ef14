"""Hyperparameter search: every trial an ordinary run of one experiment, the values chosen by optuna's TPE.

Usage::

    python run.py --search minilm_glue_downstream80 --space sparse_glue --trials 20 [--metric glue:rte/accuracy]
        [--direction max|min] [--parallel 4] [--study NAME] [--set KEY=VALUE ...]

searches experiment ``minilm_glue_downstream80`` over search space ``sparse_glue`` until the study holds 20 complete
trials. The same command again resumes the study and extends it: ``--trials`` counts the trials already complete,
and a trial a killed search left unfinished runs again in its own directory with ``--resume``. Each call starts
at most as many trials as are missing, so a failed trial is replaced by the next call rather than retried forever.

A trial is ``python run.py EXPERIMENT --set <the command's --set> --set <the trial's values>`` in its own process
(a crash stays there; ``--parallel P`` keeps P trials running, each on one GPU of ``CUDA_VISIBLE_DEVICES``),
written to ``<output root>/search/<study>/trial<k>/`` with config.json, metrics.json, DONE and registry rows as
any run. The output root is the command's own, so ``kd.teacher`` and ``model.init_from`` run names resolve as
for a plain run. ``<study>`` is ``<experiment>-<space>`` unless ``--study`` names it. Beside the trials:

    study.sqlite3            optuna's study; this process is its only writer (trial processes never open it)
    logs/trial<k>.log        everything a trial's process printed
    summary.json, summary.md the best trial, its command line and every trial, rewritten after each trial

Metrics (``--metric``): for finetuning, ``headline`` (the default): the mean over the experiment's tasks of each
task's headline metric (its mean over the task's runs), the first present of ``score`` (GLUE's leaderboard number
per task, as in the GLUE table), ``f1`` (SQuAD, GAP, CSV), ``accuracy``, ``matthews_corr``, ``pearson``; or
``TASK/METRIC``, e.g. ``glue:rte/accuracy``, the mean over that task's runs. For pretraining, a key of the run's
metrics.json, ``eval_loss`` by default. The direction defaults to min for losses and perplexity, else max. A METRIC
a GLUE task does not measure is refused before any trial runs; other tasks' metrics are known only from their runs.

Search spaces are plain dicts beside the experiments, in ``sparsebert/experiments/*.py`` or a module of your own
(``--experiments PATH``)::

    SEARCH_SPACES = {"tiny": {"description": "...", "params": {
        "train.learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True},
        "train.epochs": {"type": "int", "low": 1, "high": 3, "step": 1},          # step optional
        "finetune.pad_to_multiple_of": {"type": "categorical", "choices": [8, 64]},
    }}}

A space is checked before any trial runs: its specs, and every key by building the experiment with it.
"""

from sparsebert.search.plan import SearchPlan, plan_search
from sparsebert.search.study import run_search

__all__ = ["SearchPlan", "plan_search", "run_search"]
