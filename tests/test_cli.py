"""``python run.py`` (the ``sparsebert`` command) as a user runs it: bad input fails in one line with exit 2 and leaves no run behind.

The end-to-end cases run ``run.py`` as a subprocess from a temp directory (so nothing depends on the cwd), all
started at once by a module fixture to keep the suite fast on two cores. Pure configuration errors are also
checked in-process through ``cli.main``. A command that needs a data directory only to get as far as its error
gets the checked-in slices (``asset_data_dir``): none of these tests depends on more data than they hold.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sparsebert.cli import main
from sparsebert.config import ExperimentRegistry
from sparsebert.search.plan import SearchPlan

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "run.py"
CORPUS = "wikipedia-enwiki-2015-wikiextractor"
EXPERIMENT = "bert_tiny_quick"


@dataclass
class Case:
    root: Path  # this case's temp dir: cwd/, out/, data/, hf/
    args: list[str]
    env: dict[str, str] | None = None
    module: bool = False  # python -m sparsebert instead of python run.py
    proc: subprocess.Popen | None = None
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("SPARSEBERT_DATA", "SPARSEBERT_OUTPUT")}
        env.update(HF_DATASETS_CACHE=str(self.root / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1", PYTHONWARNINGS="ignore")
        env.update(self.env or {})
        if self.module:  # this checkout's package, whatever an editable install points at
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
        command = ["-m", "sparsebert"] if self.module else [str(RUN)]
        self.proc = subprocess.Popen([sys.executable, *command, *self.args], cwd=self.cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self) -> Case:
        if self.returncode is None:
            assert self.proc is not None
            self.stdout, self.stderr = self.proc.communicate(timeout=180)
            self.returncode = self.proc.returncode
        return self


def _corrupt_gz(root: Path, payload: bytes) -> Path:
    bad = root / "data" / CORPUS / "text" / "AA" / "wiki_00.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(payload)
    return bad


GARBAGE = bytes((i * 7919 + 13) % 256 for i in range(4096))


@pytest.fixture(scope="module")
def cases(tmp_path_factory, asset_data_dir):
    def root(name: str) -> Path:
        return tmp_path_factory.mktemp(name)

    made: dict[str, Case] = {}
    r = root("list")
    made["list"] = Case(r, ["--list"])
    made["module_list"] = Case(root("module_list"), ["--list"], module=True)
    r = root("unknown")
    made["unknown"] = Case(r, ["bert_tiny_quik", "--output-dir", str(r / "out")])
    for key, item in [("set_unknown", "train.max_step=3"), ("set_type", "train.max_steps=abc"),
                      ("set_seq", "data.max_seq_length=1024")]:
        r = root(key)
        made[key] = Case(r, [EXPERIMENT, "--set", item, "--output-dir", str(r / "out")])
    r = root("noexp")
    made["noexp"] = Case(r, [])
    r = root("nodata")
    made["nodata"] = Case(r, [EXPERIMENT, "--data-dir", "/nonexistent", "--output-dir", str(r / "out")])
    r = root("empty")
    (r / "data" / CORPUS).mkdir(parents=True)
    made["empty"] = Case(r, [EXPERIMENT, "--data-dir", str(r / "data"), "--output-dir", str(r / "out")])
    r = root("garbage")
    _corrupt_gz(r, GARBAGE)
    made["garbage"] = Case(r, [EXPERIMENT, "--data-dir", str(r / "data"), "--output-dir", str(r / "out")])
    r = root("truncated")
    # real text gzipped, then cut in half: the stream ends before its end-of-stream marker
    whole = gzip.compress((asset_data_dir / CORPUS / "text" / "AA" / "wiki_00").read_bytes(), mtime=0)
    _corrupt_gz(r, whole[: len(whole) // 2])
    made["truncated"] = Case(r, [EXPERIMENT, "--data-dir", str(r / "data"), "--output-dir", str(r / "out")])
    for case in made.values():
        case.start()
    yield made
    for case in made.values():
        if case.proc is not None and case.proc.poll() is None:
            case.proc.kill()
            case.proc.communicate()


def one_line_error(stderr: str) -> str:
    """The whole stderr must be one line (no traceback, no log lines before it)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(("error:", "sparsebert:")), stderr
    return lines[0]


def final_error(stderr: str) -> str:
    """After a run started (log lines, progress bars on stderr): exactly one error line, last, no traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert stderr.strip().splitlines()[-1] == errors[0]
    return errors[0]


def assert_no_run(case: Case) -> None:
    assert not (case.cwd / "runs").exists()  # the default output root, relative to the cwd
    assert not (case.out / EXPERIMENT).exists()
    assert not list(case.root.rglob("DONE"))


# --- subprocess: run.py from another directory -----------------------------------------------------------------


def test_list_from_another_directory(cases):
    case = cases["list"].wait()
    assert case.returncode == 0, case.stderr
    registry = ExperimentRegistry.builtin()
    listed = {}
    for line in case.stdout.strip().splitlines():
        name, _, description = line.partition("  ")
        listed[name] = description.strip()
    assert listed == {name: registry.description(name) for name in registry.names()}
    assert {"bert_base", "bert_100k", EXPERIMENT} <= set(listed)
    assert all(listed.values())
    assert_no_run(case)


def test_python_m_sparsebert_is_run_py(cases):
    """``python -m sparsebert`` (what the ``sparsebert`` command runs) lists the same, from the package alone."""
    module, script = cases["module_list"].wait(), cases["list"].wait()
    assert module.returncode == 0, module.stderr
    assert module.stdout == script.stdout and "bert_tiny_quick  " in module.stdout
    assert_no_run(module)


def test_unknown_experiment_names_closest_matches(cases):
    case = cases["unknown"].wait()
    assert case.returncode == 2
    line = one_line_error(case.stderr)
    assert "bert_tiny_quik" in line and "bert_tiny_quick" in line
    assert case.stdout == ""
    assert not case.out.exists()
    assert_no_run(case)


@pytest.mark.parametrize("case_name,keys", [
    ("set_unknown", ["'train.max_step'", "did you mean 'train.max_steps'"]),
    ("set_type", ["train.max_steps"]),
    ("set_seq", ["data.max_seq_length", "model.max_position_embeddings"]),
])
def test_bad_set_exits_2_naming_the_key_subprocess(cases, case_name, keys):
    case = cases[case_name].wait()
    assert case.returncode == 2
    line = one_line_error(case.stderr)
    for key in keys:
        assert key in line
    assert not case.out.exists()
    assert_no_run(case)


def test_no_experiment_given_exits_nonzero_subprocess(cases):
    case = cases["noexp"].wait()
    assert case.returncode != 0
    assert "--list" in one_line_error(case.stderr)
    assert_no_run(case)


def test_missing_data_dir_exits_2_in_one_line(cases):
    case = cases["nodata"].wait()
    assert case.returncode == 2
    line = one_line_error(case.stderr)
    assert "/nonexistent" in line and "--data-dir" in line
    assert not case.out.exists()
    assert_no_run(case)


def test_empty_corpus_dir_exits_2_and_creates_no_run(cases):
    case = cases["empty"].wait()
    assert case.returncode == 2, case.stderr[-3000:]
    line = final_error(case.stderr)
    empty_dir = str((case.data / CORPUS).resolve())
    assert empty_dir in line or "--data-dir" in line, line
    assert_no_run(case)


def test_garbage_gz_corpus_file_exits_2_naming_the_file(cases):
    with pytest.raises(gzip.BadGzipFile):  # the payload really is not a gzip file
        gzip.decompress(GARBAGE)
    case = cases["garbage"].wait()
    assert case.returncode == 2, case.stderr[-3000:]
    line = final_error(case.stderr)
    assert str((case.data / CORPUS / "text" / "AA" / "wiki_00.gz").resolve()) in line, line
    assert_no_run(case)


def test_truncated_gz_corpus_file_exits_2_naming_the_file(cases):
    case = cases["truncated"].wait()
    assert case.returncode == 2, case.stderr[-3000:]
    line = final_error(case.stderr)
    assert str((case.data / CORPUS / "text" / "AA" / "wiki_00.gz").resolve()) in line, line
    assert_no_run(case)


# --- in-process: configuration errors fail before any data or directory is touched ---------------------------


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("overrides,keys", [
    (["train.max_step=3"], ["train.max_step", "did you mean 'train.max_steps'"]),
    (["train.max_steps=abc"], ["train.max_steps"]),
    (["data.max_seq_length=1024"], ["data.max_seq_length", "model.max_position_embeddings"]),
    (["model.size=huge"], ["model.size"]),
    (["train.lr_scheduler=foo"], ["train.lr_scheduler", "'foo'"]),
    (["train.optim=foo"], ["train.optim", "'foo'"]),
])
def test_bad_set_exits_2_naming_the_key(tmp_path, capsys, overrides, keys):
    argv = [EXPERIMENT, "--output-dir", str(tmp_path / "out"), "--data-dir", "/nonexistent"]
    for item in overrides:
        argv += ["--set", item]
    code, out, err = run_main(argv, capsys)
    assert code == 2
    line = one_line_error(err)
    for key in keys:
        assert key in line
    assert not (tmp_path / "out").exists()


def test_no_experiment_given_exits_nonzero(tmp_path, capsys):
    code, out, err = run_main(["--output-dir", str(tmp_path / "out")], capsys)
    assert code != 0
    assert "--list" in one_line_error(err)
    assert not (tmp_path / "out").exists()


def test_unknown_second_experiment_fails_before_the_first_runs(tmp_path, capsys):
    code, out, err = run_main([EXPERIMENT, "bert_tiny_quik", "--output-dir", str(tmp_path / "out"),
                               "--data-dir", str(tmp_path)], capsys)
    assert code == 2
    assert "bert_tiny_quik" in one_line_error(err)
    assert not (tmp_path / "out").exists()


def test_abbreviated_flags_are_refused(tmp_path, capsys):
    """--gpu must not pass for --gpus: the relaunch under torchrun strips --gpus by its full name only, and
    would start itself again and again."""
    with pytest.raises(SystemExit) as e:
        main([EXPERIMENT, "--gpu", "1", "--output-dir", str(tmp_path / "out")])
    assert e.value.code == 2
    assert "unrecognized arguments: --gpu" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_finetuning_beyond_the_models_positions_is_refused_before_a_run_exists(tmp_path, capsys, asset_data_dir):
    code, out, err = run_main(["tiny_glue", "--set", "finetune.max_seq_length=1024", "--output-dir",
                               str(tmp_path / "out"), "--data-dir", str(asset_data_dir)], capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error:") and "finetune.max_seq_length=1024" in line and "512 position" in line
    assert not (tmp_path / "out" / "tiny_glue").exists()


def test_missing_data_dir_from_env_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPARSEBERT_DATA", str(tmp_path / "no_such_data"))
    code, out, err = run_main([EXPERIMENT, "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 2
    line = one_line_error(err)
    assert str(tmp_path / "no_such_data") in line and "SPARSEBERT_DATA" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["--data-dir", "$SPARSEBERT_DATA"])
def test_a_data_dir_that_is_a_file_says_so(tmp_path, capsys, monkeypatch, source):
    """Not "does not exist": the path is there, it is just not a directory (a data file named by mistake)."""
    a_file = tmp_path / "dev-v1.1.json"
    a_file.write_text("{}")
    argv = [EXPERIMENT, "--output-dir", str(tmp_path / "out")]
    if source == "--data-dir":
        argv += ["--data-dir", str(a_file)]
    else:
        monkeypatch.setenv("SPARSEBERT_DATA", str(a_file))
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert one_line_error(err) == f"error: data directory {a_file} (from {source}) is not a directory"
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is refused only without a GPU")
def test_half_precision_on_cpu_is_refused_before_the_run_directory(tmp_path, capsys, asset_data_dir):
    out = tmp_path / "out"
    code, _, err = run_main([EXPERIMENT, "--set", "train.precision=fp16", "--output-dir", str(out),
                             "--data-dir", str(asset_data_dir)], capsys)
    assert code == 2
    assert "train.precision=fp16" in final_error(err)
    assert not (out / EXPERIMENT).exists()  # else the next plain run would call it an unfinished run


def test_sparsity_include_matching_nothing_exits_2_in_one_line(tmp_path, capsys, asset_data_dir):
    out = tmp_path / "out"
    code, _, err = run_main(["sparse_tiny_rigl", "--set", "sparsity.include=nomatch", "--set", "data.max_files=1",
                             "--output-dir", str(out), "--data-dir", str(asset_data_dir)], capsys)
    assert code == 2
    assert "sparsity.include" in final_error(err)
    assert not (out / "sparse_tiny_rigl").exists()


def test_one_gpu_keeps_the_users_experiments(tmp_path, capsys, monkeypatch):
    """--gpus with one GPU continues in this process, with the --experiments it was given."""
    import sparsebert.distributed.gpus as gpus

    monkeypatch.setattr(gpus, "query_gpus", lambda: [gpus.GpuState(0, 1_000, 90), gpus.GpuState(1, 70_000, 0)])
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("mine_quick: {parent: bert_tiny_quick, description: my own}\n")
    # mine_quick is found (an unknown name would be the error) and gets as far as the data directory
    code, _, err = run_main(["--gpus", "1", "mine_quick", "--experiments", "mine.yaml", "--output-dir",
                             str(tmp_path / "out"), "--data-dir", str(tmp_path / "no_data")], capsys)
    assert code == 2 and "no_data (from --data-dir) does not exist" in one_line_error(err)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_several_gpus_restart_with_the_same_arguments(tmp_path, capsys, monkeypatch):
    """torchrun's workers get the command's arguments but --gpus, --experiments included (they start in its cwd)."""

    import sparsebert.distributed.gpus as gpus

    calls = []
    monkeypatch.setattr(gpus, "query_gpus", lambda: [gpus.GpuState(0, 70_000, 0), gpus.GpuState(1, 70_000, 0)])
    monkeypatch.setattr(os, "execv", lambda path, cmd: calls.append(cmd))  # torchrun replaces the process
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("mine_quick: {parent: bert_tiny_quick}\n")
    run_main(["mine_quick", "--gpus", "2", "--experiments", "mine.yaml"], capsys)
    (cmd,) = calls
    assert cmd[0] == sys.executable
    assert "--gpus" not in cmd and cmd[-3:] == ["mine_quick", "--experiments", "mine.yaml"]


# --- in-process: names of runs and inputs of finetuning jobs fail before any run directory exists --------------


def test_an_output_dir_under_a_file_fails_before_anything_is_prepared(tmp_path, capsys, asset_data_dir, monkeypatch):
    import sparsebert.runner

    monkeypatch.setattr(sparsebert.runner, "make_job", lambda *a, **k: pytest.fail("data and model were prepared"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "out"):
        code, _, err = run_main([EXPERIMENT, "--output-dir", str(out), "--data-dir", str(asset_data_dir)], capsys)
        assert code == 2
        line = final_error(err)
        assert str(out) in line and f"{blocker} is a file" in line


def test_a_mistyped_run_name_is_no_such_run_with_the_close_names(tmp_path, capsys, asset_data_dir):
    out = tmp_path / "out"
    (out / "bert_tiny_quick").mkdir(parents=True)  # the run meant (what it holds does not matter here)
    code, _, err = run_main(["glue_from=bert_tiny_quik", "--output-dir", str(out), "--data-dir", str(asset_data_dir)],
                            capsys)
    assert code == 2
    line = final_error(err)
    assert "no run bert_tiny_quik" in line and str(out) in line and "close: bert_tiny_quick" in line
    assert "hub" not in line and "huggingface" not in line  # not a network failure
    assert not (out / "glue_from=bert_tiny_quik").exists()


def test_a_hub_id_that_does_not_load_fails_before_the_run_directory(tmp_path, capsys, asset_data_dir, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no retries against an unreachable hub
    out = tmp_path / "out"
    code, _, err = run_main(["tiny_glue", "--set", "model.init_from=someorg/no-such-model", "--output-dir", str(out),
                             "--data-dir", str(asset_data_dir)], capsys)
    assert code == 2
    line = final_error(err)
    assert "someorg/no-such-model" in line and "huggingface" in line.lower()
    assert not (out / "tiny_glue").exists()


def test_a_missing_pretraining_teacher_is_no_such_run(tmp_path, capsys, asset_data_dir):
    out = tmp_path / "out"
    code, _, err = run_main(["sparse_tiny_kd_onecycle_lr_rigl", "--output-dir", str(out), "--data-dir",
                             str(asset_data_dir)], capsys)
    assert code == 2
    line = final_error(err)
    assert "kd.teacher bert_tiny_quick" in line and str(out) in line and "huggingface" not in line
    assert not (out / "sparse_tiny_kd_onecycle_lr_rigl").exists()


def test_a_missing_finetuning_teacher_fails_before_the_run_directory(tmp_path, capsys, asset_data_dir):
    out = tmp_path / "out"
    code, _, err = run_main(["tiny_gap_kd", "--output-dir", str(out), "--data-dir", str(asset_data_dir)], capsys)
    assert code == 2
    line = final_error(err)
    assert "kd.teacher tiny_gap" in line and str(out) in line
    assert not (out / "tiny_gap_kd").exists()


def test_after_a_bad_gap_row_is_fixed_the_same_command_runs(tmp_path, capsys, asset_data_dir):
    """The bad row is found before the run directory exists, so the fixed data are not refused as an
    "unfinished run" of the failed command."""
    gap = tmp_path / "data" / "gap"
    gap.mkdir(parents=True)
    shutil.copy(asset_data_dir / "gap" / "gap-validation.tsv", gap)
    good = (asset_data_dir / "gap" / "gap-development.tsv").read_text(encoding="utf-8")
    lines = good.splitlines(keepends=True)
    row = lines[5].split("\t")
    row[5] = "x"  # A-offset
    (gap / "gap-development.tsv").write_text("".join([*lines[:5], "\t".join(row), *lines[6:]]), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["tiny_gap", "--output-dir", str(out), "--data-dir", str(tmp_path / "data"), "--set",
            "finetune.max_train_samples=8", "--set", "finetune.max_eval_samples=8", "--set",
            "finetune.save_model=false"]
    code, _, err = run_main(argv, capsys)
    assert code == 2
    line = final_error(err)
    assert "gap-development.tsv" in line and f"row {row[0]}" in line and "A-offset" in line
    assert not (out / "tiny_gap").exists()
    (gap / "gap-development.tsv").write_text(good, encoding="utf-8")
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    assert (out / "tiny_gap" / "DONE").is_file()


def test_keys_lists_every_key_set_accepts(capsys):
    """--keys is the reference of every experiment key: each one it prints resolves as a --set key, and the
    sections' keys are all there (a key added to a section shows up without editing any list)."""
    import dataclasses

    from sparsebert.config import ExperimentConfig
    from sparsebert.config.schema import field_type
    from sparsebert.sparsity.config import GMPConfig

    assert main(["--keys"]) == 0
    keys = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    for key in keys:
        field_type(ExperimentConfig, key)  # raises ConfigError for a key --set would refuse
    assert {f"gmp.{f.name}" for f in dataclasses.fields(GMPConfig)} <= set(keys)
    assert {"train.learning_rate", "kd.student_from_teacher", "finetune.epochs_per_task"} <= set(keys)


@pytest.mark.parametrize("main_process", [True, False])
def test_only_the_main_process_logs_the_finished_line(tmp_path, caplog, monkeypatch, asset_data_dir, main_process):
    """Under a launcher every rank returns the run's metrics; one line per job says it finished (rank 0's)."""
    import types

    import sparsebert.distributed
    import sparsebert.runner

    monkeypatch.setattr(sparsebert.runner, "run_experiment", lambda cfg, opts, callbacks: {"eval_loss": 2.5})
    monkeypatch.setattr(sparsebert.distributed, "process_state",
                        lambda: types.SimpleNamespace(is_main_process=main_process))
    with caplog.at_level("INFO", logger="sparsebert"):
        code = main([EXPERIMENT, "--output-dir", str(tmp_path), "--data-dir", str(asset_data_dir)])
    assert code == 0
    finished = [r.getMessage() for r in caplog.records if "finished:" in r.getMessage()]
    assert finished == ([f"{EXPERIMENT} finished: eval_loss=2.5"] if main_process else [])


def test_a_swallowed_sigterm_stops_the_run_and_the_next_is_not_started(tmp_path, capsys, monkeypatch, asset_data_dir):
    """The SIGTERM handler's exception can land in a finalizer, which swallows it (as on a lease: after a run's
    last save). run.py still exits 143 at the run's next step check, and no later experiment starts."""
    from signal_helpers import sigterm_inside_a_finalizer

    import sparsebert.runner

    started, swallowed = [], []

    def run_experiment(cfg, opts, callbacks):
        started.append(cfg.name)
        swallowed.extend(sigterm_inside_a_finalizer())
        for callback in callbacks:  # what the Trainer does after the next optimizer step
            callback.on_step_end(None, None, None)
        return {"eval_loss": 2.5}

    monkeypatch.setattr(sparsebert.runner, "run_experiment", run_experiment)
    code = main([EXPERIMENT, EXPERIMENT, "--output-dir", str(tmp_path), "--data-dir", str(asset_data_dir)])
    assert [type(e).__name__ for e in swallowed] == ["Terminated"]
    assert code == 143 and started == [EXPERIMENT]
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: terminated by SIGTERM"


def test_ctrl_c_ends_in_one_line_with_the_status_of_sigint(monkeypatch, capsys):
    import sparsebert.cli as cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    assert main([EXPERIMENT]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: interrupted (Ctrl-C)") and "\n" not in err


def _closed_pipe() -> int:
    """The write end of a pipe whose reader is already gone: every write to it fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def test_list_into_a_closed_pipe_exits_quietly():
    """``run.py --list | head -1``: the reader leaves early; run.py stops without a traceback (status 141, as a
    process SIGPIPE ends)."""
    write_end = _closed_pipe()
    try:
        proc = subprocess.run([sys.executable, str(RUN), "--list"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    finally:
        os.close(write_end)
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


@pytest.mark.parametrize("argv", [["--runs"], ["--runs", "--format", "csv"], ["--table", "glue"]])
def test_runs_and_table_into_a_closed_pipe_exit_quietly(tmp_path, monkeypatch, capsys, argv):
    from sparsebert.results import RunRecord, RunRegistry

    RunRegistry.in_output_root(tmp_path).record(RunRecord(
        run_dir=str(tmp_path / "exp/glue_rte/run0"), task="glue:rte", status="done", experiment="exp",
        model="minilm", seed=42, metrics={"accuracy": 0.625, "score": 0.625}))
    write_end = _closed_pipe()
    with open(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main([*argv, "--output-dir", str(tmp_path)]) == 141
    assert capsys.readouterr().err == ""


def test_only_the_main_process_logs_info(monkeypatch):
    """Under a launcher every rank runs run.py: INFO on rank 0 (or outside a launcher), WARNING and up elsewhere."""
    import logging

    from sparsebert.cli import log_level
    from sparsebert.distributed import RANK_VARIABLES

    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert log_level() == logging.INFO
    monkeypatch.setenv("RANK", "1")  # torchrun, accelerate launch
    assert log_level() == logging.WARNING
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("PMI_RANK", "0")  # mpirun
    assert log_level() == logging.INFO


def test_a_refused_export_says_one_line_and_nothing_of_torchao(tmp_path):
    """transformers imports torchao where it is installed; its import-time lines about kernel libraries it cannot
    load (and torch's deprecation notes on them) must not surround the one-line error."""
    done = subprocess.run([sys.executable, "-m", "sparsebert", "--export", "nothing", "--to", str(tmp_path / "x")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --export nothing: no such run (looked in . and runs)"]


def test_list_with_words_lists_the_names_that_contain_them(capsys):
    code, out, err = run_main(["--list", "glue", "sparse80"], capsys)
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines()]
    assert "minilm_glue_sparse80" in names and "minilm_glue_downstream80" not in names
    assert all("glue" in name and "sparse80" in name for name in names)


def test_list_with_a_word_no_name_contains_is_one_line_error(capsys):
    code, out, err = run_main(["--list", "no_such_word"], capsys)
    assert code == 2 and out == ""
    assert "no experiment name contains 'no_such_word'" in one_line_error(err)


@pytest.mark.parametrize("argv,message", [
    (["--table", "glue", "nosuch_experiment"], "--table runs no experiment; drop nosuch_experiment (--only NAME"),
    (["--plot", "loss", "some_run"], "--plot runs no experiment; drop some_run (--only RUN"),
    (["--runs", "nosuch_experiment"], "--runs runs no experiment; drop nosuch_experiment"),
    (["--runs", "--only", "foo"], "--only goes with --table or --plot, not --runs (it lists every run; --status"),
    (["--export", "r", "--to", "d", EXPERIMENT], f"--export runs no experiment; drop {EXPERIMENT}"),
    (["--train-tokenizer", "tok", EXPERIMENT], f"--train-tokenizer runs no experiment; drop {EXPERIMENT}"),
    (["--runs", "--set", "seed=1"], "--runs takes no --set"),
    (["--export", "r", "--to", "d", "--set", "seed=1"], "--export takes no --set"),
    (["--table", "glue", "--set", "seed=1", "--set", "train.max_steps=2"],
     "--table takes no --set (it changes the experiment you run, --show or --predict with); drop --set seed=1 "
     "--set train.max_steps=2"),
    (["--list", "--set", "seed=1"], "--list takes no --set"),
    (["--profile", "--list"], "--profile goes with running experiments, not with --list; drop --profile"),
    (["--gpus", "2", "--table", "glue"], "--gpus goes with running experiments, not with --table; drop --gpus"),
    (["--show", EXPERIMENT, "--overwrite", "--resume"], "--resume and --overwrite go with running experiments"),
    (["--runs", "--table", "glue"], "--runs and --table are separate commands; give one at a time"),
    ([EXPERIMENT, "--resume", "--overwrite"], "--resume continues an unfinished run and --overwrite deletes it"),
    ([EXPERIMENT, "--only", "foo"], "--only goes with --table or --plot"),
    # flags with a default of their own: a value given where nothing reads it (the default would not tell)
    ([EXPERIMENT, "--vocab-size", "50000"],
     "error: --vocab-size goes with --train-tokenizer, not with running experiments; drop --vocab-size 50000"),
    ([EXPERIMENT, "--max-files", "1"], "--max-files goes with --train-tokenizer, not with running experiments"),
    (["--runs", "--agg", "mean"], "error: --agg goes with --table, not with --runs; drop --agg mean"),
    (["--status", "done", "--agg", "mean"], "--agg goes with --table, not with --runs; drop --agg mean"),
    (["--list", "--format", "csv"], "error: --format goes with --table or --runs, not with --list; drop --format csv"),
    (["--show", EXPERIMENT, "--format", "latex"], "--format goes with --table or --runs, not with --show"),
    (["--plot", "loss", "--only", "r", "--format", "csv"],
     "--format goes with --table or --runs, not with --plot (the suffix of --out picks the image format)"),
    (["--table", "glue", "--corpus", "c", "--corpus-format", "text"],
     "error: --corpus goes with --train-tokenizer and --corpus-format with --train-tokenizer, not with --table; "
     "drop --corpus c --corpus-format text"),
    (["--export", "r", "--to", "d", "--out", "m.png"],
     "error: --out goes with --plot, not with --export (--export writes to --to DIR); drop --out m.png"),
    (["--train-tokenizer", "tok", "--status", "done"], "--status goes with --runs, not with --train-tokenizer"),
    (["--train-tokenizer", "tok", "--compressed"],
     "error: --compressed goes with --export, not with --train-tokenizer; drop --compressed"),
    (["--search", EXPERIMENT, "--space", "s", "--trials", "1", "--agg", "mean"],
     "error: --agg goes with --table, not with --search; drop --agg mean"),
])
def test_arguments_the_command_would_ignore_are_refused(tmp_path, capsys, argv, message):
    """Each would otherwise pass silently: a user would think it filtered (or changed) what the command did."""
    code, out, err = run_main([*argv, "--output-dir", str(tmp_path / "out"), "--data-dir", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert message in one_line_error(err)
    assert not (tmp_path / "out").exists()


def test_format_and_agg_still_work_with_table_and_runs(tmp_path, capsys):
    """The flags refused elsewhere are read where they belong, and left out they are the defaults --help names."""
    from sparsebert.results import RunRecord, RunRegistry

    registry = RunRegistry.in_output_root(tmp_path)
    for k, accuracy in enumerate((0.5, 0.75)):  # two seeds: max 75.0, mean 62.5
        registry.record(RunRecord(run_dir=str(tmp_path / f"exp/glue_rte/run{k}"), task="glue:rte", status="done",
                                  experiment="exp", model="minilm", seed=42 + k,
                                  metrics={"accuracy": accuracy, "score": accuracy}))
    root = ["--output-dir", str(tmp_path)]
    code, out, err = run_main(["--table", "glue", *root], capsys)
    assert code == 0 and out.startswith("|") and " 75.0 " in out and "62.5" not in out, err  # md, max
    code, out, err = run_main(["--table", "glue", "--format", "csv", "--agg", "mean", *root], capsys)
    assert code == 0 and "|" not in out and ",62.5," in out and "75.0" not in out, err
    code, out, err = run_main(["--runs", "--format", "csv", *root], capsys)
    assert code == 0 and out.startswith("run,experiment,task,") and len(out.strip().splitlines()) == 3, err


@pytest.mark.parametrize("run_name,problem", [
    (".", "cannot name a run directory: use letters"),
    ("..", "cannot name a run directory: use letters"),
    ("../elsewhere", "cannot name a run directory: use letters"),
    ("/tmp/abs", "cannot name a run directory: use letters"),
    ("search", "the output root keeps its search studies there"),
    ("search/study", "cannot name a run directory: use letters"),  # a study, not a trial
    ("search/../trial001", "cannot name a run directory: use letters"),
    ("registry.sqlite", "the output root keeps its run registry there"),
])
def test_a_run_name_that_is_no_run_directory_of_its_own_is_refused(tmp_path, capsys, run_name, problem):
    code, out, err = run_main([EXPERIMENT, "--run-name", run_name, "--overwrite", "--output-dir",
                               str(tmp_path / "out"), "--data-dir", str(tmp_path)], capsys)
    line = one_line_error(err)
    assert code == 2 and line.startswith(f"error: --run-name {run_name} ") and problem in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("run_name", [
    SearchPlan.run_name(SimpleNamespace(study="glue_from=bert_100k-lr.v2"), 7),  # search/<study>/trial007
    "glue_from=bert_100k~rte~lr2e-5",  # scripts/pretrain_study.sh's
    "bert_100k_2gpu",  # bench/real_loop_scaling.py's
])
def test_run_names_of_search_trials_and_scripts_pass(tmp_path, capsys, run_name):
    """They get as far as the data directory, which does not exist."""
    code, _, err = run_main([EXPERIMENT, "--run-name", run_name, "--output-dir", str(tmp_path / "out"),
                             "--data-dir", str(tmp_path / "no_data")], capsys)
    assert code == 2 and "no_data (from --data-dir) does not exist" in one_line_error(err)


def test_checking_a_run_name_imports_no_optuna():
    """A pretraining or GLUE process of a study passes --run-name; the GPU image has no optuna (a --search
    dependency), so the check must not import sparsebert.search. In a fresh process: here it may be imported."""
    code = ("import sys; sys.modules['optuna'] = None\n"
            "from sparsebert.cli import check_run_name_flag\n"
            "check_run_name_flag('glue_from=bert_small_wiki~rte~lr1e-4'); check_run_name_flag('search/s/trial001')\n"
            "print('optuna' in sys.modules and sys.modules['optuna'] is not None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
