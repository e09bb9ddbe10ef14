"""``--search``: search spaces checked before any trial, metrics read from real metrics.json shapes, and real
searches of the tiny MiniLM experiment on CPU: killed mid-trial, resumed, completed, summarized."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from sparsebert.cli import main
from sparsebert.config import ConfigError, ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.results import RunRegistry
from sparsebert.search import plan_search, run_search
from sparsebert.search import study as study_module
from sparsebert.search.metrics import (
    RUN_KEYS,
    check_metric,
    default_direction,
    metric_keys,
    metric_value,
    task_metric_names,
)
from sparsebert.search.space import parse_space
from sparsebert.search.study import open_study, run_trials
from sparsebert.search.trials import TrialProcess, trial_env, trial_outcome

REPO = Path(__file__).resolve().parents[2]
STUDY = "tiny_search-tiny"
# 32 training rows (2 optimizer steps): what is tested is the search around the runs, not what they learn
FEW_ROWS = ["--set", "finetune.max_train_samples=32"]


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def plan(registry: ExperimentRegistry, root: Path, data_dir: Path, space: str = "tiny", **kwargs):
    return plan_search(registry, "tiny_search", space, 2, output_root=root, data_dir=data_dir,
                       **kwargs)


# --- search spaces ---------------------------------------------------------------------------------------------
# (planning reads only the data directory's layout: these tests use the checked-in slices, asset_data_dir)


def lr(**spec) -> dict:
    return {"params": {"train.learning_rate": spec}}


@pytest.mark.parametrize("space,words", [
    (lr(type="float", low=1e-5, high=1e-4, lg=True), ["train.learning_rate", "unknown key(s) lg"]),
    (lr(type="float", low=1e-4, high=1e-5), ["train.learning_rate", "low (0.0001) must be below high"]),
    (lr(type="float", low=0.0, high=1e-4, log=True), ["train.learning_rate", "log range needs low > 0"]),
    (lr(type="int", low=1, high=3.5), ["train.learning_rate", "high must be an integer"]),
    (lr(type="int", low=1, high=3, step=0), ["train.learning_rate", "step must be a positive integer"]),
    (lr(type="categorical", choices=[]), ["train.learning_rate", "non-empty list"]),
    (lr(type="categorical", choices=[[1, 2]]), ["train.learning_rate", "numbers, strings"]),
    (lr(type="uniform", low=1, high=2), ["train.learning_rate", "type float, int or categorical"]),
    ({"params": {}}, ["'params' must map"]),
    ({"description": "x", "param": {}}, ["unknown key(s) param"]),
    ({"description": ["x"], "params": {}}, ["description must be a string"]),
])
def test_a_bad_spec_is_refused_naming_the_space_and_key(space, words):
    with pytest.raises(ConfigError) as e:
        parse_space("bad", space)
    assert "search space 'bad'" in str(e.value)
    for word in words:
        assert word in str(e.value)


def test_specs_become_the_distributions_they_describe():
    dists = parse_space("ok", {"params": {
        "train.learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True},
        "train.epochs": {"type": "int", "low": 1, "high": 3},
        "finetune.pad_to_multiple_of": {"type": "categorical", "choices": [8, 64, None]},
    }})
    assert dists["train.learning_rate"] == optuna.distributions.FloatDistribution(1e-5, 1e-4, log=True)
    assert dists["train.epochs"] == optuna.distributions.IntDistribution(1, 3, step=1)
    assert dists["finetune.pad_to_multiple_of"].choices == (8, 64, None)


@pytest.mark.parametrize("params,words", [
    ({"train.learnign_rate": {"type": "float", "low": 1e-5, "high": 1e-4}},
     ["unknown key 'train.learnign_rate'", "did you mean 'train.learning_rate'"]),
    ({"train.epochs": {"type": "float", "low": -1.0, "high": 2.0}}, ["train.epochs=-1.0", "train.epochs"]),
    # the registry refuses the value, not the key: tiny_search has no distillation teacher
    ({"kd.alpha": {"type": "float", "low": 0.5, "high": 1.0}}, ["kd.alpha=0.5", "kd.teacher"]),
    ({"finetune.gap_head": {"type": "categorical", "choices": ["mul", "sum"]}},
     ["finetune.gap_head=sum", "finetune.gap_head must be one of"]),
])
def test_every_key_and_value_of_a_space_is_built_before_any_trial(asset_data_dir, tmp_path, params, words):
    registry = ExperimentRegistry.builtin()  # its own: the space added here stays in this test
    registry.add_space("typo", {"params": params})
    with pytest.raises(ConfigError) as e:
        plan(registry, tmp_path, asset_data_dir, space="typo")
    assert "search space 'typo' on tiny_search" in str(e.value)
    for word in words:
        assert word in str(e.value)
    assert not tmp_path.joinpath("search").exists()


@pytest.mark.parametrize("experiment,space", [
    ("search_glue_downstream80", "sparse_finetune"), ("search_glue_downstream80", "sparse_schedule"),
    ("minilm_glue_sparse80", "transfer"), ("minilm_glue", "glue_lr"), ("tiny_search", "tiny"),
])
def test_shipped_spaces_fit_their_experiments(registry, asset_data_dir, tmp_path, experiment, space):
    p = plan_search(registry, experiment, space, 5, output_root=tmp_path, data_dir=asset_data_dir)
    assert p.metric == "headline" and p.direction == "max" and p.study == f"{experiment}-{space}"
    assert p.parallel == 1 and p.gpus == []  # CPU


def test_space_names_are_unique_and_looked_up_with_close_names(tmp_path, registry):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text('SEARCH_SPACES = {"s": {"params": {}}}\n')
    with pytest.raises(ConfigError, match="search space 's'.*twice"):
        ExperimentRegistry.from_directory(tmp_path)
    with pytest.raises(ConfigError, match="'tinny'.*tiny"):
        registry.space("tinny")


# --- metrics -----------------------------------------------------------------------------------------------------


def summary(**per_task) -> dict:
    """A finetuning experiment's metrics.json: {task: {"runs": n, metric: {"mean", "std", "max"}}}."""
    out = {task: {"runs": 2, **{k: {"mean": v, "std": 0.1, "max": v + 0.1} for k, v in metrics.items()}}
           for task, metrics in per_task.items()}
    return {**out, "wall_time_s": 12.5}


GLUE = summary(**{"glue:rte": {"accuracy": 0.6, "score": 0.6, "global_step": 4},
                  "glue:mrpc": {"f1": 0.8, "accuracy": 0.7, "score": 0.75}})


def test_finetuning_headline_is_the_mean_of_each_tasks_leaderboard_score():
    assert metric_value(GLUE, "headline") == pytest.approx((0.6 + 0.75) / 2)
    assert metric_value(GLUE, "glue:mrpc/f1") == 0.8  # the mean over the task's runs
    squad = summary(squad_v1={"exact": 60.0, "f1": 70.0, "total": 48})
    assert metric_value(squad, "headline") == 70.0  # no score: f1 comes next
    assert metric_value(summary(gap={"accuracy": 0.5, "f1": 0.4, "log_loss": 1.0}), "headline") == 0.4


def test_a_missing_metric_lists_the_ones_there():
    with pytest.raises(SparseBertError) as e:
        metric_value(GLUE, "glue:rte/f1")
    assert "glue:rte/f1 is not in metrics.json" in str(e.value)
    available = "available: headline, glue:rte/accuracy, glue:rte/score, glue:rte/global_step, glue:mrpc/f1"
    assert available in str(e.value)
    with pytest.raises(SparseBertError, match="available: eval_loss, perplexity"):
        metric_value({"eval_loss": 2.0, "perplexity": 7.4, "note": "x"}, "masked_accuracy")
    assert metric_keys({"glue:x": {"runs": 1, "loss": {"mean": 1.0}}}) == ["glue:x/loss"]  # no headline there


def test_pretraining_metrics_are_flat_keys_minimized_when_losses():
    pretrain = {"eval_loss": 2.5, "perplexity": 12.2, "masked_accuracy": 0.4, "wall_time_s": 30.0}
    assert metric_value(pretrain, "eval_loss") == 2.5
    assert [default_direction(m) for m in ("eval_loss", "perplexity", "gap/log_loss", "headline",
                                           "masked_accuracy")] == ["min", "min", "min", "max", "max"]


def test_metric_form_must_fit_the_experiment(registry):
    glue, mlm = registry.build("tiny_search"), registry.build("bert_tiny_quick")
    check_metric("glue:rte/accuracy", glue, ["glue:rte"])
    check_metric("eval_loss", mlm, [])
    for metric, cfg, tasks in [("rte/accuracy", glue, ["glue:rte"]), ("eval_loss", glue, ["glue:rte"]),
                               ("glue:rte/", glue, ["glue:rte"]), ("glue:rte/a/b", glue, ["glue:rte"]),
                               ("headline", mlm, []), ("x/eval_loss", mlm, [])]:
        with pytest.raises(SparseBertError, match=f"--metric {metric}"):
            check_metric(metric, cfg, tasks)


def test_a_metric_the_task_does_not_measure_is_refused_naming_those_it_does(registry):
    glue = registry.build("tiny_search")
    for metric in ("glue:rte/accuracy", "glue:rte/score", "glue:rte/wall_time_s", "glue:mrpc/f1",
                   "glue:mnli/accuracy_matched", "glue:stsb/spearman", "headline"):
        check_metric(metric, glue, ["glue:rte", "glue:mrpc", "glue:mnli", "glue:stsb"])
    for metric, tasks, names in [("glue:rte/acc", ["glue:rte"], "accuracy, score, global_step"),
                                 ("glue:rte/f1", ["glue:rte"], "accuracy, score"),
                                 ("glue:mnli/accuracy", ["glue:mnli"], "accuracy_matched, accuracy_mismatched"),
                                 ("glue:stsb/accuracy", ["glue:stsb"], "pearson, spearman, score")]:
        with pytest.raises(SparseBertError) as e:
            check_metric(metric, glue, tasks)
        assert f"--metric {metric}: {tasks[0]} runs do not measure" in str(e.value)
        assert f"one of {names}" in str(e.value)
    # the metrics of SQuAD, GAP and CSV runs are known only from a run: those are read from its metrics.json
    assert task_metric_names("squad_v2") is task_metric_names("gap") is task_metric_names("csv") is None
    check_metric("squad_v2/HasAns_f1", glue, ["squad_v2"])


def test_the_run_keys_are_those_every_finetuning_run_adds(registry, tmp_path):
    """RUN_KEYS against what finish_run itself writes beside a (sparse) run's task metrics."""
    from types import SimpleNamespace

    from sparsebert.jobs.finetune.common import finish_run

    cfg = registry.build("tiny_search", ["finetune.save_model=false"])
    ctx = SimpleNamespace(cfg=cfg, output_root=tmp_path, model_source="minilm", pretrain_metrics={})
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=2, log_history=[{"train_runtime": 1.0, "train_samples_per_second": 32.0}]),
        sparsity=SimpleNamespace(report=lambda: {"selected": {"sparsity": 0.8}}),
        accelerator=SimpleNamespace(wait_for_everyone=lambda: None), is_world_process_zero=lambda: True)
    metrics = finish_run(ctx, trainer, tmp_path / "run0", "glue:rte", 1, {"accuracy": 0.5, "score": 0.5}, 0.0)
    assert sorted(metrics) == sorted(["accuracy", "score", *RUN_KEYS])


def test_cli_refuses_bad_search_input_in_one_line_before_writing(tmp_path, asset_data_dir, capsys):
    base = ["--search", "tiny_search", "--space", "tiny", "--output-dir", str(tmp_path / "out"),
            "--data-dir", str(asset_data_dir)]
    for extra, words in [(["--trials", "0"], "--trials 0"), (["--trials", "2", "--parallel", "0"], "--parallel 0"),
                         (["--trials", "2", "--metric", "rte/accuracy"], "glue:rte/accuracy"),
                         (["--trials", "2", "--metric", "glue:rte/acc"], "with METRIC one of accuracy, score"),
                         (["--trials", "2", "--study", "../x"], "--study ../x"), ([], "--trials N")]:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error:") and words in err, err
    assert main(["--search", "tiny_serch", "--space", "tiny", "--trials", "1",
                 "--output-dir", str(tmp_path / "out")]) == 2
    assert "closest: tiny_search" in capsys.readouterr().err
    assert main(["tiny_search", "--trials", "1"]) == 2
    assert "--trials: only with --search" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- studies: no trial runs here ---------------------------------------------------------------------------------


class FakeTrialProcess:
    """A trial process that ends after ``polls`` polls, exit code 0."""

    def __init__(self, polls: int):
        self.polls, self.returncode = polls, None

    def poll(self) -> int | None:
        self.polls -= 1
        if self.polls <= 0:
            self.returncode = 0
        return self.returncode


def test_trials_go_to_the_least_used_gpu_and_never_more_than_parallel(registry, asset_data_dir, tmp_path,
                                                                      monkeypatch):
    """run_trials itself, its trial processes faked: a trial starts on the GPU with the fewest running trials (the
    first of a tie), at most ``--parallel`` at once, and a GPU is free again when its trial ends."""
    p = dataclasses.replace(plan(registry, tmp_path, asset_data_dir, parallel=3), gpus=["2", "5"], trials=5)
    # trials 0 (GPU 2) and 1 (GPU 5) end in the same poll while trial 2 runs on GPU 2: trial 3 goes to GPU 5, not
    # back to GPU 2 beside trial 2 (a queue of freed GPUs would), and trial 4 to GPU 2
    polls = iter([1, 1, 5, 1, 1])
    started: list[tuple[int, str | None, int]] = []  # (trial, its GPU, trials running when it started)
    running: list[TrialProcess] = []

    def start(trial, _plan, gpu):
        running[:] = [t for t in running if t.process.returncode is None]
        started.append((trial.number, gpu, len(running)))
        running.append(TrialProcess(trial, FakeTrialProcess(next(polls)), gpu, tmp_path / "log", "run"))
        return running[-1]

    def finish(study, done, _plan):
        study.tell(done.trial, 1.0)

    monkeypatch.setattr(study_module, "POLL_S", 0)
    monkeypatch.setattr(study_module, "start_trial", start)
    monkeypatch.setattr(study_module, "finish_trial", finish)
    monkeypatch.setattr(study_module, "write_summary", lambda *args: None)
    study = optuna.create_study(direction="maximize")
    assert run_trials(study, p, lambda: None) == []
    assert [gpu for _, gpu, _ in started] == ["2", "5", "2", "5", "2"]
    assert max(n for _, _, n in started) == 2  # the third started beside two: never a fourth
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 5


def test_each_trial_gets_one_gpu_or_a_share_of_the_cpu(registry, asset_data_dir, tmp_path, monkeypatch):
    """What pins a trial to its GPU (no GPU here: the environment handed to the trial process is checked)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    p = plan(registry, tmp_path, asset_data_dir, parallel=2)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert trial_env(p, "5")["CUDA_VISIBLE_DEVICES"] == "5"
    # trials side by side get a share of the cores each, on GPUs too (their host work would oversubscribe the CPU)
    assert trial_env(p, "5")["OMP_NUM_THREADS"] == trial_env(p, None)["OMP_NUM_THREADS"] == "4"
    src = str(REPO / "src")
    assert trial_env(p, None)["PYTHONPATH"].split(os.pathsep)[0] == src  # the trial imports this sparsebert


def test_trials_side_by_side_train_their_runs_one_at_a_time(registry, asset_data_dir, tmp_path):
    """Trials that share the GPU do not each start the GPU fast path's 4 runs at once, unless the search says so."""
    from sparsebert.search.trials import trial_sets

    params = {"train.learning_rate": 1e-4}
    assert "finetune.parallel_runs=1" in trial_sets(plan(registry, tmp_path, asset_data_dir, parallel=2), params)
    assert not any("parallel_runs" in item
                   for item in trial_sets(plan(registry, tmp_path, asset_data_dir, parallel=1), params))
    told = plan(registry, tmp_path, asset_data_dir, parallel=2, overrides=["finetune.parallel_runs=2"])
    assert [item for item in trial_sets(told, params) if "parallel_runs" in item] == ["finetune.parallel_runs=2"]


def test_a_users_experiment_file_reaches_the_trials(asset_data_dir, tmp_path, monkeypatch):
    """A search of an experiment of ``--experiments FILE``: each trial process loads the file too, and the best
    command names it."""
    import sparsebert.search.trials as trials
    from sparsebert.cli import load_registry, parser

    mine = tmp_path / "mine.yaml"
    mine.write_text("my_search: {parent: tiny_search, train: {learning_rate: 5.0e-5}}\n")
    p = plan_search(ExperimentRegistry.builtin([mine]), "my_search", "tiny", 2, output_root=tmp_path / "out",
                    data_dir=asset_data_dir, experiment_paths=[mine])
    assert p.command_line({}) == f"python run.py my_search --experiments {mine}"
    p.study_dir.mkdir(parents=True)  # (run_search makes it)
    started = []
    monkeypatch.setattr(trials.subprocess, "Popen", lambda command, **kwargs: started.append(command))
    trials.start_trial(optuna.create_study().ask(), p, None)
    (command,) = started
    assert command[1:3] == ["-m", "sparsebert"]
    args = parser().parse_args(command[3:])  # what the trial process does with it
    assert load_registry(args).build("my_search", args.overrides).train.learning_rate == 5e-5


def test_a_study_continues_only_with_the_settings_it_started_with(registry, asset_data_dir, tmp_path):
    first = plan(registry, tmp_path, asset_data_dir)
    first.study_dir.mkdir(parents=True)
    open_study(first)
    open_study(plan(registry, tmp_path, asset_data_dir))  # the same: fine
    for changed, word in [({"metric": "glue:rte/accuracy"}, "metric"), ({"direction": "min"}, "direction"),
                          ({"overrides": ["train.epochs=2"]}, "overrides")]:
        with pytest.raises(SparseBertError, match=f"{word}.*--study"):
            open_study(plan(registry, tmp_path, asset_data_dir, **changed))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_study_file_is_one_line_and_left_as_it_is(asset_data_dir, tmp_path, capsys, damage):
    """Bytes that are no SQLite database, or a database cut short after its header: the search refuses in one line
    naming the file and what to do, runs no trial, and leaves the file for whoever wants to look at it."""
    study = tmp_path / "out" / "search" / STUDY / "study.sqlite3"
    study.parent.mkdir(parents=True)
    study.write_bytes(b"\x07 not sqlite \x00" * 300 if damage == "garbage" else b"SQLite format 3\x00" + bytes(3000))
    before = study.read_bytes()
    code = main(["--search", "tiny_search", "--space", "tiny", "--trials", "1", "--output-dir", str(tmp_path / "out"),
                 "--data-dir", str(asset_data_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: the study file {study} cannot be read (file is not a database)")
    assert "move it aside" in err[0] and "--study NAME" in err[0]
    assert study.read_bytes() == before
    assert sorted(p.name for p in study.parent.iterdir()) == ["search.lock", "study.sqlite3"]  # no trial, no summary


def test_a_second_search_of_a_running_study_is_refused(registry, asset_data_dir, tmp_path):
    p = plan(registry, tmp_path, asset_data_dir)
    p.study_dir.mkdir(parents=True)
    with open(p.study_dir / "search.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SparseBertError, match="--search.*tiny_search-tiny"):
            run_search(p)


def test_a_trial_fails_on_a_bad_exit_or_a_missing_metric(tmp_path):
    log = tmp_path / "trial000.log"
    log.write_text("loading\nerror: model path /x does not exist\n\n")
    metrics = tmp_path / "metrics.json"
    assert trial_outcome(2, log, metrics, "headline") == (None, "exit code 2: error: model path /x does not exist")
    assert trial_outcome(-9, log, metrics, "headline")[1].startswith("killed by signal 9: ")
    assert f"cannot read {metrics}" in trial_outcome(0, log, metrics, "headline")[1]
    metrics.write_text(json.dumps(summary(**{"glue:rte": {"accuracy": 0.5, "score": 0.5}})))
    assert trial_outcome(0, log, metrics, "glue:rte/accuracy") == (0.5, None)
    value, error = trial_outcome(0, log, metrics, "glue:rte/f1")
    assert value is None and error == ("metric glue:rte/f1 is not in metrics.json (available: headline, "
                                       f"glue:rte/accuracy, glue:rte/score) ({metrics})")
    metrics.write_text(json.dumps({"eval_loss": float("nan")}))
    assert trial_outcome(0, log, metrics, "eval_loss")[1] == f"eval_loss is nan in {metrics}"


def test_a_swallowed_sigterm_stops_the_search_and_its_trials(registry, asset_data_dir, tmp_path, monkeypatch):
    """A SIGTERM whose exception a finalizer swallowed (SQLAlchemy, under optuna, keeps weakref callbacks) still
    ends the search at its next poll: the running trial is terminated and no second trial starts."""
    from signal_helpers import sigterm_inside_a_finalizer

    import sparsebert.search.study
    from sparsebert.errors import Terminated
    from sparsebert.search.trials import TrialProcess
    from sparsebert.sigterm import terminate_on_sigterm

    started, swallowed = [], []

    def start_trial(trial, plan, gpu):  # a trial process that would run for 5 s, then fail (no metrics.json)
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        started.append(process)
        swallowed.extend(sigterm_inside_a_finalizer())
        return TrialProcess(trial, process, gpu, tmp_path / f"trial{trial.number}.log", plan.run_name(trial.number))

    monkeypatch.setattr(sparsebert.search.study, "start_trial", start_trial)
    t0 = time.monotonic()
    with terminate_on_sigterm() as raise_if_terminated, pytest.raises(Terminated):
        run_search(plan(registry, tmp_path, asset_data_dir), raise_if_terminated)
    assert [type(e) for e in swallowed] == [Terminated]
    assert len(started) == 1 and started[0].returncode is not None and time.monotonic() - t0 < 4


# --- real searches (CPU) -----------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARSEBERT_DATA", "SPARSEBERT_OUTPUT")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONWARNINGS="ignore")
    return env


def _states(root: Path) -> list[tuple[int, str]]:
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{root}/search/{STUDY}/study.sqlite3")
    return [(t.number, t.state.name) for t in study.trials]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, data_dir):
    """A search killed (SIGKILL) while trial 0 trains, then run again in-process through cli.main with two trials
    at a time: what the kill left, the second call's exit code and stdout, and the output root."""
    root = tmp_path_factory.mktemp("search")
    args = ["--search", "tiny_search", "--space", "tiny", "--trials", "2", "--output-dir", str(root),
            "--data-dir", str(data_dir), *FEW_ROWS]
    search = subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], env=_env(), cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trial0 = root / "search" / STUDY / "trial000"
    deadline = time.time() + 180
    while not (trial0 / "config.json").is_file():  # the run has started training
        assert search.poll() is None and time.time() < deadline, "the search ended before trial 0 started training"
        time.sleep(0.05)
    trial_processes = psutil.Process(search.pid).children(recursive=True)
    search.kill()
    search.wait()
    _, orphans = psutil.wait_procs(trial_processes, timeout=10)
    killed = {"states": _states(root), "trial0_done": (trial0 / "DONE").is_file(), "trial_processes":
              len(trial_processes), "orphans": orphans}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*args, "--parallel", "2"])
    return {"root": root, "killed": killed, "code": code, "stdout": out.getvalue()}


@pytest.mark.slow
def test_a_killed_search_takes_its_trials_down_and_leaves_them_running(resumed):
    killed = resumed["killed"]
    assert killed["states"] == [(0, "RUNNING")] and not killed["trial0_done"]
    assert killed["trial_processes"] >= 1 and killed["orphans"] == []  # no trial writes on behind a dead search


@pytest.mark.slow
def test_the_resumed_search_completes_every_trial_once(resumed):
    root = resumed["root"]
    assert resumed["code"] == 0
    assert _states(root) == [(0, "COMPLETE"), (1, "COMPLETE")]  # no trial lost, none failed
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{root}/search/{STUDY}/study.sqlite3")
    rates = [t.params["train.learning_rate"] for t in study.trials]
    assert len(set(rates)) == 2  # the resumed sampler did not draw trial 0's value again
    # trial 0 went on in its own directory, with the settings it started with
    config = json.loads((root / "search" / STUDY / "trial000" / "config.json").read_text())
    assert config["train"]["learning_rate"] == rates[0]
    log = (root / "search" / STUDY / "logs" / "trial000.log").read_text()
    assert log.count("running search/tiny_search-tiny/trial000") == 2  # started, killed, started again


@pytest.mark.slow
def test_every_trial_is_an_ordinary_run(resumed):
    root = resumed["root"]
    for k in range(2):
        run = root / "search" / STUDY / f"trial{k:03d}"
        assert {"DONE", "config.json", "metrics.json"} <= {p.name for p in run.iterdir()}
        config = json.loads((run / "config.json").read_text())
        assert config["name"] == f"search/{STUDY}/trial{k:03d}"
        assert config["finetune"]["max_train_samples"] == 32  # the command's own --set reaches every trial
        assert (run / "glue_rte" / "run0" / "DONE").is_file()
    records = RunRegistry.in_output_root(root, read_only=True).runs()
    assert sorted((r.experiment, r.task, r.status) for r in records) == [
        (f"search/{STUDY}/trial{k:03d}", "glue:rte", "done") for k in range(2)]


@pytest.mark.slow
def test_the_summary_names_the_best_trial_and_its_command(resumed):
    root = resumed["root"]
    summary = json.loads((root / "search" / STUDY / "summary.json").read_text())
    values = {t["number"]: t["value"] for t in summary["trials"]}
    metrics = {k: json.loads((root / "search" / STUDY / f"trial{k:03d}" / "metrics.json").read_text())
               for k in range(2)}
    assert values == {k: metric_value(m, "headline") for k, m in metrics.items()}
    assert summary["best_value"] == max(values.values()) == values[summary["best_trial"]]
    best = next(t for t in summary["trials"] if t["number"] == summary["best_trial"])
    rate = f"train.learning_rate={best['params']['train.learning_rate']!r}"
    assert summary["best_overrides"] == ["finetune.max_train_samples=32", rate]
    assert summary["best_command"] == f"python run.py tiny_search --set finetune.max_train_samples=32 --set {rate}"
    assert [t["run_dir"] for t in summary["trials"]] == [f"search/{STUDY}/trial{k:03d}" for k in range(2)]
    assert all(t["state"] == "COMPLETE" and t["duration_s"] > 0 for t in summary["trials"])
    markdown = (root / "search" / STUDY / "summary.md").read_text()
    assert summary["best_command"] in markdown
    first_row = next(line for line in markdown.splitlines() if line.startswith("| ") and "COMPLETE" in line)
    assert first_row.startswith(f"| {summary['best_trial']} | COMPLETE |")  # best first
    assert f"best: trial {summary['best_trial']}, headline = " in resumed["stdout"]


@pytest.mark.slow
def test_trials_already_complete_count(resumed, data_dir, capsys):
    root = resumed["root"]
    code = main(["--search", "tiny_search", "--space", "tiny", "--trials", "1", "--output-dir", str(root),
                 "--data-dir", str(data_dir), *FEW_ROWS])
    assert code == 0 and len(_states(root)) == 2  # nothing started
    assert f"summary: {root / 'search' / STUDY / 'summary.md'}" in capsys.readouterr().out


@pytest.mark.slow
def test_failing_trials_end_the_search_with_one_error_line(data_dir, tmp_path, capsys):
    """Every trial's process exits with an error (a model that is not there): the study records why."""
    code = main(["--search", "tiny_search", "--space", "tiny", "--trials", "1", "--output-dir", str(tmp_path),
                 "--data-dir", str(data_dir), "--set", "model.init_from=/nonexistent"])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: 0 of 1 trials complete; 1 failed in this call, first trial 0: exit code 2: "
                           "error: model path /nonexistent does not exist"), last
    summary = json.loads((tmp_path / "search" / STUDY / "summary.json").read_text())
    assert summary["best_trial"] is None and summary["trials"][0]["state"] == "FAIL"
    assert "model path /nonexistent does not exist" in summary["trials"][0]["error"]
