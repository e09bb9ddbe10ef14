"""A user's own experiments (``--experiments PATH``: .py, .yaml, a folder) beside the built-in ones, which ship in the
package; ``--show NAME`` prints an experiment with each value's origin; the built wheel holds the experiments and
the ``sparsebert`` command. All in-process (the modules are imported already) but the wheel build (~2 s)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparsebert.cli import main
from sparsebert.config import ExperimentRegistry
from sparsebert.config.experiment_registry import builtin_experiments_dir, origin_of

REPO = Path(__file__).resolve().parents[1]

USER_PY = '''
SHARED = {"learning_rate": 3e-5}
EXPERIMENTS = {
    "my_glue": {
        "parent": "minilm_glue_kd",
        "description": "my sparse recipe",
        "train": SHARED,
        "sparsity": {"sparsity": 0.5, "init": "magnitude"},
    },
}
SEARCH_SPACES = {"my_space": {"description": "mine", "params": {
    "train.learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True}}}}
'''
USER_YAML = """
my_yaml:
  parent: my_glue
  description: my_glue, hotter KD
  kd: {temperature: 4.0}
  finetune: {runs_per_task: {rte: 1}}
"""


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A folder with a .py and a .yaml experiment file, the YAML one deriving from the .py one."""
    folder = tmp_path_factory.mktemp("mine")
    (folder / "mine.py").write_text(USER_PY)
    (folder / "more.yaml").write_text(USER_YAML)
    (folder / "notes.txt").write_text("not an experiment file: ignored in a folder")
    return folder


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def shown_rows(out: str) -> dict[str, tuple[str, str]]:
    """``--show``'s rows: key -> (value, origin), origin ``default`` for the rows under ``defaults:``."""
    rows, origin_default = {}, False
    for line in out.splitlines():
        if line.startswith("on a GPU"):  # what the GPU fast path changes: not the experiment's values
            break
        if line == "defaults:":
            origin_default = True
        elif line.startswith("  ") and not line.startswith(("  defined in", "  parents:")):
            key, value = line.strip().split(None, 1)
            if origin_default:
                rows[key] = (value, "default")
            else:
                value, _, origin = value.rpartition("  <- ")
                rows[key] = (value.strip(), origin)
    return rows


def test_user_files_derive_from_built_in_parents_and_show_the_origin_of_each_value(user_dir, capsys):
    code, out, err = run_main(["--show", "my_yaml", "--experiments", str(user_dir / "mine.py"), "--experiments",
                               str(user_dir / "more.yaml"), "--set", "train.epochs=2"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "my_yaml: my_glue, hotter KD"
    assert lines[1] == f"  defined in {user_dir / 'more.yaml'}"
    assert lines[2] == "  parents: my_yaml <- my_glue <- minilm_glue_kd <- minilm_glue"
    rows = shown_rows(out)
    assert rows["kd.temperature"] == ("4.0", "my_yaml")
    assert rows["finetune.runs_per_task"] == ("{'rte': 1}", "my_yaml")  # a mapping: replaced whole, as merged
    assert rows["train.learning_rate"] == ("3e-05", "my_glue")
    assert rows["sparsity.sparsity"] == ("0.5", "my_glue")
    assert rows["kd.alpha"] == ("1.0", "minilm_glue_kd")
    assert rows["train.global_batch_size"] == ("32", "minilm_glue")
    assert rows["train.epochs"] == ("2.0", "--set")
    assert rows["seed"] == ("42", "default")
    assert rows["sparsity.distribution"][1] == "default"  # a section the experiment sets: its other keys are defaults
    # the values --show prints are those the run would get
    cfg = ExperimentRegistry.builtin([user_dir]).build("my_yaml", ["train.epochs=2"])
    assert (cfg.kd.temperature, cfg.train.learning_rate, cfg.sparsity.sparsity) == (4.0, 3e-5, 0.5)
    assert repr(cfg.sparsity.distribution) == rows["sparsity.distribution"][0]


def test_show_says_what_the_gpu_fast_path_changes_on_a_gpu(capsys):
    code, out, _ = run_main(["--show", "minilm_glue"], capsys)
    assert code == 0
    fast = out.split("on a GPU, finetune.gpu_fast_path makes these", 1)[1].splitlines()[1:]
    changes = {line.split()[0]: line.split(None, 1)[1] for line in fast}
    assert changes["train.torch_compile"] == "False -> True"
    assert changes["finetune.pad_to_multiple_of"] == "8 -> 128"
    assert changes["finetune.parallel_runs"].startswith("None -> up to 4 per GPU")
    assert shown_rows(out)["train.torch_compile"] == ("False", "default")  # the experiment as written
    # runs at once the experiment sets stay; without the fast path there is nothing to add
    code, out, _ = run_main(["--show", "minilm_glue", "--set", "finetune.parallel_runs=2"], capsys)
    assert "finetune.parallel_runs" not in out.split("on a GPU", 1)[1]
    code, out, _ = run_main(["--show", "bert_100k"], capsys)
    assert code == 0 and "on a GPU" not in out


def test_a_folder_adds_its_experiments_and_search_spaces_to_the_built_in_ones(user_dir, capsys):
    code, out, err = run_main(["--list", "--experiments", str(user_dir)], capsys)
    assert code == 0, err
    listed = dict(line.split(None, 1) for line in out.splitlines())
    assert listed["my_glue"] == "my sparse recipe" and listed["my_yaml"] == "my_glue, hotter KD"
    assert set(ExperimentRegistry.builtin().names()) < set(listed)
    assert "my_space" in ExperimentRegistry.builtin([user_dir]).space_names()


def test_origins_follow_the_merge(tmp_path):
    """A section set to None and then again key by key, a mapping replaced whole, NAME=<run>, --set into a section
    that was None."""
    reg = ExperimentRegistry({
        "a": {"kd": {"teacher": "t", "alpha": 0.5}, "finetune": {"runs_per_task": {"rte": 3, "mrpc": 3}}},
        "b": {"parent": "a", "kd": None, "finetune": {"runs_per_task": {"cola": 1}}},
        "c": {"parent": "b", "kd": {"teacher": "u"}},
    })
    found = reg.origins("c")
    assert origin_of(found, "kd.teacher") == "c" and origin_of(found, "kd.alpha") == "default"
    assert origin_of(found, "finetune.runs_per_task") == "b"
    assert origin_of(found, "seed") == "default"
    assert origin_of(reg.origins("b"), "kd.teacher") == "b"  # b set the section whole (to None)
    assert origin_of(reg.origins("c=some/run"), "model.init_from") == "c=some/run"
    after_set = reg.origins("b", ["kd.temperature=3"])
    assert origin_of(after_set, "kd.temperature") == "--set" and origin_of(after_set, "kd.teacher") == "default"


def test_a_name_of_a_built_in_experiment_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "clash.yaml").write_text("minilm_glue: {description: my own minilm_glue}\n")
    code, out, err = run_main(["--list", "--experiments", str(tmp_path / "clash.yaml")], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (f"error: experiment 'minilm_glue' is defined twice: "
                           f"{builtin_experiments_dir() / 'finetune.py'} and {tmp_path / 'clash.yaml'}")


@pytest.mark.parametrize("name,text,message", [
    ("missing.py", None, "no such file or folder"),
    ("notes.txt", "x", "expected a .py, .yaml or .yml file, or a folder of them"),
    ("list.yaml", "- a\n- b\n", "expected a mapping of experiment name -> settings, got list"),
    ("broken.yml", "a: [1, 2\n", "not valid YAML"),
    ("raises.py", "raise RuntimeError('no GPU here')\n", "cannot load it: RuntimeError: no GPU here"),
    ("table.py", "EXPERIMENTS = ['a']\n", "EXPERIMENTS must be a dict"),
    ("scalar.yaml", "mine: 3\n", "experiment 'mine'"),
    ("orphan.yaml", "mine: {parent: nope}\n", "unknown parent 'nope'"),
    ("list_parent.yaml", "mine: {parent: [tiny_glue]}\n", "parent must be the name of one experiment"),
    ("exits.py", "raise SystemExit(3)\n", "cannot load it: SystemExit: 3"),
    ("equals.yaml", "a=b: {parent: bert_tiny_quick}\n", "cannot hold '='"),
])
def test_a_bad_experiments_file_is_one_line(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    code, _, err = run_main(["--show", "mine", "--experiments", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert str(path) in lines[0]  # the file to fix


def test_list_names_an_unknown_parent_and_its_file_before_printing_anything(tmp_path, capsys):
    (tmp_path / "orphan.yaml").write_text("aaa_first: {parent: bert_tiny_quick}\nmine: {parent: nowhere}\n")
    code, out, err = run_main(["--experiments", str(tmp_path / "orphan.yaml"), "--list"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"error: experiment 'mine' in {tmp_path / 'orphan.yaml'} names an unknown parent 'nowhere'"


def test_a_parent_cycle_names_its_file(tmp_path, capsys):
    (tmp_path / "loop.yaml").write_text("mine: {parent: yours}\nyours: {parent: mine}\n")
    code, out, err = run_main(["--experiments", str(tmp_path / "loop.yaml"), "--list"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"error: experiment parents form a cycle: mine -> yours -> mine (in {tmp_path / 'loop.yaml'})"


@pytest.mark.parametrize("name,keep", [
    (".", "out/canary.txt"),  # the output root
    ("..", "canary.txt"),  # the output root's parent
    ("search", "out/search/study/study.sqlite3"),  # every search study
])
def test_overwrite_cannot_delete_the_output_root_or_what_it_keeps(tmp_path, capsys, name, keep):
    """An experiment named like this is refused when its file is read: --overwrite never gets to its run
    directory (a data directory that does not exist stops the run before it, should the name pass)."""
    (tmp_path / keep).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / keep).write_text("keep me")
    evil = tmp_path / "evil.yaml"
    evil.write_text(f'"{name}": {{parent: bert_tiny_quick}}\n')
    code, out, err = run_main(["--experiments", str(evil), name, "--output-dir", str(tmp_path / "out"), "--overwrite",
                               "--data-dir", str(tmp_path / "no_data")], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"error: experiment '{name}' in {evil} cannot name a run directory"), err
    assert (tmp_path / keep).read_text() == "keep me"


@pytest.mark.parametrize("argv,message", [
    (["--keys", "minilm_glue"], "use --show minilm_glue"),
    (["--show", "minilm_glue", "tiny_glue"], "--show prints one experiment and runs none; drop tiny_glue"),
    (["--show", "minilm_glue", "--set", "train.epoch=2"], "did you mean 'train.epochs'"),
    (["--table", "glue", "--experiments", "minilm_glue"], "take their experiments or runs with --only"),
])
def test_show_and_keys_refuse_what_they_cannot_do(capsys, argv, message):
    code, out, err = run_main(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err


def test_the_wheel_holds_the_experiments_and_the_command(tmp_path):
    """``pip wheel`` of a copy of the checkout (the build writes build/ and *.egg-info beside its sources)."""
    source = tmp_path / "src_tree"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("sparsebert-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = zf.read(entry_points).decode()
    shipped = {f"sparsebert/experiments/{p.name}" for p in (REPO / "src/sparsebert/experiments").glob("*.py")}
    assert len(shipped) > 3 and shipped <= names
    assert "sparsebert/__main__.py" in names
    assert "[console_scripts]\nsparsebert = sparsebert.cli:main" in scripts
