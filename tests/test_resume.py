"""--resume ends where the uninterrupted run ends: pretraining and finetuning, dense and sparse, whenever the run
was stopped (before its first checkpoint, between two, after the last; killed, terminated or crashed).

Pretraining runs 9 steps with a checkpoint every 3 and only the newest kept (``train.save_total_limit=1``): the
checkpoint a resume starts from is rotated away by the next one, as in every real resume with two more checkpoints
to go. A finetuning run keeps no checkpoints: its unit of resumption is the run (here 2 runs of one task, a step
each), so it is stopped before its first run finishes, between the runs and after the last. To keep this affordable
one run is stopped several times, at one point after another, and resumed each time.

Ends equal means: the same weights (``torch.equal``: training on CPU is deterministic, and a resume restores the
optimizer, scheduler, RNG and mask state), the same metrics, ``global_step`` exactly the schedule's, no checkpoint
past it, ``DONE`` and every registry row ``done``. samples/s is a speed, not a result: it must be every step's
samples over the run's training time, and within 0.05x-20x of the uninterrupted run's. The window is that wide
because these runs last a second and the machine is shared: a fresh process's first steps ran 25 times slower than
a warm one's here. It still catches a figure over the wrong steps, such as none, or all 9 over a resume's moment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from interruptions import Crash, CrashAt, SignalAt, main_interrupted
from safetensors.torch import load_file
from transformers import TrainerCallback

from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.results import RunRegistry
from sparsebert.runner import RunOptions, run_experiment

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

STEPS = 9
PRETRAIN = ["data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16", "data.max_seq_length=64",
            "train.global_batch_size=8", f"train.max_steps={STEPS}", "train.eval_steps=3", "train.save_steps=3",
            "train.logging_steps=1", "train.report_to=[]", "train.warmup_steps=0", "train.save_total_limit=1"]
PRETRAINING = {"dense": ("bert_tiny_quick", PRETRAIN),
               "sparse": ("sparse_tiny_rigl", [*PRETRAIN, "rigl.update_freq=2"]),  # masks move across a resume
               # task upstream: the distillation model, its teacher outside the checkpoint, GMP pruning at 0, 5, 6
               "upstream": ("tiny_upstream", PRETRAIN)}
FINETUNE = ["finetune.glue_tasks=rte", "finetune.runs_per_task={}", "finetune.num_runs=2", "finetune.max_seq_length=64",
            "finetune.max_train_samples=8", "finetune.max_eval_samples=8", "train.global_batch_size=8",
            "train.report_to=[]"]
FINETUNING = {"dense": ("tiny_glue", FINETUNE),
              "sparse": ("tiny_glue_2to4", [*FINETUNE, "sparsity.sparsity=0.8", "sparsity.pattern=unstructured"])}
SEEDS = (42, 43)  # of the two finetuning runs
TIMINGS = ("train_samples_per_second", "train_runtime_s", "wall_time_s")


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def run(registry, experiment: tuple[str, list[str]], root: Path, data_dir: Path, resume: bool = False,
        callbacks=()) -> None:
    name, overrides = experiment
    run_experiment(registry.build(name, overrides), RunOptions(output_root=root, data_dir=data_dir, resume=resume),
                   callbacks=list(callbacks))


def cli(experiment: tuple[str, list[str]], root: Path, data_dir: Path, *flags: str) -> list[str]:
    """run.py's arguments for ``experiment``."""
    name, overrides = experiment
    sets = [arg for key in overrides for arg in ("--set", key)]
    return [name, "--output-dir", str(root), "--data-dir", str(data_dir), *sets, *flags]


def killed(experiment, root: Path, data_dir: Path, tmp_path: Path, step: int, after_save: bool = False,
           seed: int | None = None) -> None:
    """Runs ``experiment`` in a process of its own and kills it (SIGKILL) at the given point."""
    # as many threads as this process: another count sums in another order, and the weights would differ in the
    # last bits from the uninterrupted run's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
           "OMP_NUM_THREADS": str(torch.get_num_threads()), "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, str(REPO / "tests" / "interruptions.py"), str(int(signal.SIGKILL)), str(step),
            "save" if after_save else "step", "-" if seed is None else str(seed), "--",
            *cli(experiment, root, data_dir)]
    with open(tmp_path / "killed.stderr", "w") as stderr:  # a file, not a pipe: training never blocks on it
        code = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr, timeout=300).returncode
    assert code == -signal.SIGKILL, (tmp_path / "killed.stderr").read_text()[-3000:]


def terminated(experiment, root: Path, data_dir: Path, capsys, step: int, after_save: bool = False,
               seed: int | None = None) -> None:
    """``run.py --resume`` of ``experiment`` in this process, sent SIGTERM at the given point: exit 143."""
    at = SignalAt(signal.SIGTERM, step, after_save, seed)
    assert main_interrupted(cli(experiment, root, data_dir, "--resume"), at) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: terminated by SIGTERM"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def assert_same_weights(model_dir: Path, reference_dir: Path) -> None:
    a, b = weights(model_dir), weights(reference_dir)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def assert_sane_speed(metrics: dict, expected: dict, samples: int) -> None:
    """samples/s is ``samples`` over the run's training time and close enough to the uninterrupted run's (see
    the module docstring for the window)."""
    assert metrics["train_samples_per_second"] == pytest.approx(samples / metrics["train_runtime_s"], rel=1e-3)
    ratio = metrics["train_samples_per_second"] / expected["train_samples_per_second"]
    assert 0.05 <= ratio <= 20, (metrics["train_samples_per_second"], expected["train_samples_per_second"])


class StepsTrained(TrainerCallback):
    """The (seed, optimizer step) pairs each process trained, one list per ``run`` call: ``processes``."""

    def __init__(self) -> None:
        self.processes: list[list[tuple[int, int]]] = []

    def next_process(self) -> StepsTrained:
        self.processes.append([])
        return self

    def on_step_end(self, args, state, control, **kwargs):
        self.processes[-1].append((args.seed, state.global_step))


def without_timings(metrics: dict) -> dict:
    return {k: without_timings(v) if isinstance(v, dict) else v for k, v in metrics.items() if k not in TIMINGS}


# ------------------------------------------------------------------------------------------------- pretraining


def uninterrupted(registry, data_dir, tmp_path_factory, experiments: dict[str, tuple[str, list[str]]]):
    """The uninterrupted run of each kind ("dense", "sparse") of ``experiments``, made when first asked for: a
    function of the kind that returns its experiment directory."""
    made: dict[str, Path] = {}

    def reference(kind: str) -> Path:
        if kind not in made:
            root = tmp_path_factory.mktemp(f"uninterrupted_{experiments[kind][0]}")
            run(registry, experiments[kind], root, data_dir)
            made[kind] = root / experiments[kind][0]
        return made[kind]

    return reference


@pytest.fixture(scope="module")
def pretrained(registry, data_dir, tmp_path_factory):
    return uninterrupted(registry, data_dir, tmp_path_factory, PRETRAINING)


def assert_same_pretraining(root: Path, kind: str, reference: Path) -> None:
    name = PRETRAINING[kind][0]
    run_dir = root / name
    assert (run_dir / "DONE").is_file()
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == [f"checkpoint-{STEPS}"]  # none past the end
    (row,) = RunRegistry.in_output_root(root).runs(status=None)
    assert (row.status, row.error, row.steps) == ("done", None, STEPS)
    metrics, expected = read_json(run_dir / "metrics.json"), read_json(reference / "metrics.json")
    assert metrics["global_step"] == expected["global_step"] == STEPS
    for key in ("eval_loss", "masked_accuracy", "initial_eval_loss", "sparsity"):
        assert metrics.get(key) == expected.get(key), key
    # the mean over every step, whichever process ran it (summed in another order: equal to rounding)
    assert metrics["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-6)
    assert_sane_speed(metrics, expected, samples=STEPS * 8)
    assert row.samples_per_second == metrics["train_samples_per_second"]
    assert_same_weights(run_dir / "model", reference / "model")


def test_a_killed_then_terminated_pretraining_run_resumes_to_the_uninterrupted_result(
        registry, data_dir, pretrained, tmp_path, capsys):
    """The issue's case: killed (SIGKILL) after its first checkpoint, resumed and terminated (SIGTERM) after the
    next, which rotated the first away, resumed again to its end, which rotates that one away too: it finishes as
    if never stopped."""
    experiment = PRETRAINING["dense"]
    root, run_dir = tmp_path / "runs", tmp_path / "runs" / experiment[0]
    killed(experiment, root, data_dir, tmp_path, step=3, after_save=True)
    assert (run_dir / "checkpoint-3" / "trainer_state.json").is_file()
    assert RunRegistry.in_output_root(root).runs(status=None)[0].status == "running"  # SIGKILL leaves it so
    terminated(experiment, root, data_dir, capsys, step=6, after_save=True)
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-6"]
    (row,) = RunRegistry.in_output_root(root).runs(status=None)
    assert (row.status, row.error) == ("failed", "terminated by SIGTERM")
    assert cli_main(["--export", str(run_dir), "--to", str(tmp_path / "export")]) == 2  # says why, not "no model/"
    assert "did not finish: terminated by SIGTERM; finish it with --resume" in capsys.readouterr().err
    assert cli_main(cli(experiment, root, data_dir, "--resume")) == 0
    assert_same_pretraining(root, "dense", pretrained("dense"))


# one run stopped at each point in turn: before the first checkpoint, between two (the dense run: the test above),
# right after the last; and the steps each process trains, resuming from the checkpoint before its stop
PRETRAINING_STOPS = {"dense": [CrashAt(2), CrashAt(STEPS, after_save=True)],
                     "sparse": [CrashAt(2), CrashAt(5), CrashAt(STEPS, after_save=True)],
                     "upstream": [CrashAt(5)]}
PRETRAINING_STEPS = {"dense": [range(1, 3), range(1, STEPS + 1), ()],
                     "sparse": [range(1, 3), range(1, 6), range(4, STEPS + 1), ()],
                     "upstream": [range(1, 6), range(4, STEPS + 1)]}


@pytest.mark.parametrize("kind", PRETRAINING)
def test_a_pretraining_run_stopped_anywhere_resumes_to_the_uninterrupted_result(
        registry, data_dir, pretrained, tmp_path, kind):
    steps = StepsTrained()
    for k, stop in enumerate(PRETRAINING_STOPS[kind]):
        with pytest.raises(Crash):
            run(registry, PRETRAINING[kind], tmp_path, data_dir, resume=k > 0, callbacks=[steps.next_process(), stop])
        assert not (tmp_path / PRETRAINING[kind][0] / "DONE").exists()
    run(registry, PRETRAINING[kind], tmp_path, data_dir, resume=True, callbacks=[steps.next_process()])
    assert steps.processes == [[(42, step) for step in trained] for trained in PRETRAINING_STEPS[kind]]
    assert_same_pretraining(tmp_path, kind, pretrained(kind))


# -------------------------------------------------------------------------------------------------- finetuning


@pytest.fixture(scope="module")
def finetuned(registry, data_dir, tmp_path_factory):
    return uninterrupted(registry, data_dir, tmp_path_factory, FINETUNING)


def assert_same_finetuning(root: Path, kind: str, reference: Path) -> None:
    experiment_dir = root / FINETUNING[kind][0]
    assert (experiment_dir / "DONE").is_file()
    summary = read_json(experiment_dir / "metrics.json")
    assert without_timings(summary) == without_timings(read_json(reference / "metrics.json"))
    rows = RunRegistry.in_output_root(root).runs(status=None)
    assert sorted((r.seed, r.status, r.error) for r in rows) == [(seed, "done", None) for seed in SEEDS]
    for k in range(len(SEEDS)):
        run_dir, expected_dir = experiment_dir / "glue_rte" / f"run{k}", reference / "glue_rte" / f"run{k}"
        assert (run_dir / "DONE").is_file()
        metrics, expected = read_json(run_dir / "metrics.json"), read_json(expected_dir / "metrics.json")
        assert without_timings(metrics) == without_timings(expected)  # global_step, accuracy, sparsity, ...
        assert_sane_speed(metrics, expected, samples=8)
        assert_same_weights(run_dir / "model", expected_dir / "model")


def test_a_killed_then_terminated_finetuning_run_resumes_to_the_uninterrupted_result(
        registry, data_dir, finetuned, tmp_path, capsys):
    """Killed (SIGKILL) in its second run, resumed and terminated (SIGTERM) in the same run, resumed again."""
    experiment = FINETUNING["dense"]
    root = tmp_path / "runs"
    killed(experiment, root, data_dir, tmp_path, step=1, seed=SEEDS[1])
    statuses = {r.seed: r.status for r in RunRegistry.in_output_root(root).runs(status=None)}
    assert statuses == {SEEDS[0]: "done", SEEDS[1]: "running"}
    terminated(experiment, root, data_dir, capsys, step=1, seed=SEEDS[1])
    statuses = {r.seed: (r.status, r.error) for r in RunRegistry.in_output_root(root).runs(status=None)}
    assert statuses == {SEEDS[0]: ("done", None), SEEDS[1]: ("failed", "terminated by SIGTERM")}
    assert cli_main(cli(experiment, root, data_dir, "--resume")) == 0
    assert_same_finetuning(root, "dense", finetuned("dense"))


# one experiment stopped at each point in turn: in its first run, in its second (the sparse one; the dense one: the
# test above), after its last (None: every run DONE, the experiment's summary not yet written); and what each
# process trains: the runs not finished, each from its first step
FINETUNING_STOPS = {"dense": [SEEDS[0], None], "sparse": [SEEDS[0], SEEDS[1], None]}
FINETUNING_STEPS = {"dense": [[(42, 1)], [(42, 1), (43, 1)], []],
                    "sparse": [[(42, 1)], [(42, 1), (43, 1)], [(43, 1)], []]}


class SummaryCrash(Crash):
    """Raised where the experiment's summary would be computed."""


def crash_in_summary(runs):
    raise SummaryCrash("crashed after the last run")


@pytest.mark.parametrize("kind", FINETUNING)
def test_a_finetuning_run_stopped_anywhere_resumes_to_the_uninterrupted_result(
        registry, data_dir, finetuned, tmp_path, monkeypatch, kind):
    from sparsebert.jobs.finetune import job as finetune

    steps = StepsTrained()
    for k, seed in enumerate(FINETUNING_STOPS[kind]):
        with monkeypatch.context() as patch, pytest.raises(Crash):
            if seed is None:
                patch.setattr(finetune, "summarize", crash_in_summary)
            stop = [] if seed is None else [CrashAt(1, seed=seed)]
            run(registry, FINETUNING[kind], tmp_path, data_dir, resume=k > 0, callbacks=[steps.next_process(), *stop])
        assert not (tmp_path / FINETUNING[kind][0] / "DONE").exists()
    run(registry, FINETUNING[kind], tmp_path, data_dir, resume=True, callbacks=[steps.next_process()])
    assert steps.processes == FINETUNING_STEPS[kind]
    assert_same_finetuning(tmp_path, kind, finetuned(kind))
