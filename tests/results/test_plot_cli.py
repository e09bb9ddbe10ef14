"""--plot on hand-made run directories: bad --out names, missing folders and malformed inputs are one-line
errors (exit 2) that leave no file behind; a good call writes the image atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparsebert.cli import main

HISTORY = [{"step": 1, "loss": 9.0}, {"step": 2, "loss": 8.0}, {"step": 2, "eval_loss": 8.5}]
REPORT = {"layers": [{"name": "bert.encoder.layer.0.attention.self.query.weight", "sparsity": 0.8},
                     {"name": "bert.encoder.layer.1.attention.self.query.weight", "sparsity": 0.7}]}


@pytest.fixture
def root(tmp_path) -> Path:
    for name, files in {"dense": {"log_history.json": HISTORY},
                        "sparse": {"log_history.json": HISTORY, "sparsity.json": REPORT},
                        "odd": {"log_history.json": {"not": "a list"}, "sparsity.json": [1, 2]}}.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        for filename, data in files.items():
            (tmp_path / "runs" / name / filename).write_text(json.dumps(data))
    return tmp_path


def plot(root: Path, kind: str, run: str, out: Path) -> int:
    return main(["--output-dir", str(root / "runs"), "--plot", kind, "--only", run, "--out", str(out)])


def test_good_plots_are_written_and_nothing_else(root):
    assert plot(root, "loss", "dense", root / "loss.png") == 0
    assert plot(root, "density", "sparse", root / "density.svg") == 0
    assert (root / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (root / "density.svg").read_bytes()[:500]
    assert sorted(p.name for p in root.iterdir()) == ["density.svg", "loss.png", "runs"]  # no temp files


@pytest.mark.parametrize("kind, run, out, message", [
    ("loss", "dense", "loss.txt", "must end in one of .png"),
    ("loss", "dense", "loss", "must end in one of .png"),
    ("loss", "dense", "no/such/folder/loss.png", "does not exist"),
    ("loss", "odd", "loss.png", "a list of log entries"),
    ("density", "odd", "density.png", "no 'layers' list"),
])
def test_bad_plot_requests_are_one_line_errors(root, capsys, kind, run, out, message):
    assert plot(root, kind, run, root / out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert sorted(p.name for p in root.iterdir()) == ["runs"]


def test_the_loss_title_says_what_the_loss_is(root):
    from sparsebert.cli import loss_title

    runs = root / "runs"
    for name, task in (("dense", "mlm"), ("sparse", "upstream")):
        (runs / name / "config.json").write_text(json.dumps({"task": task}))
    assert loss_title(runs, ["dense"]) == "MLM loss"
    assert loss_title(runs, ["sparse"]) == "distance to the teacher's layers (task upstream)"
    assert loss_title(runs, ["dense", "sparse"]) == "loss"
    assert plot(root, "loss", "sparse", root / "upstream.svg") == 0
    assert b"task upstream" in (root / "upstream.svg").read_bytes()


def test_a_finetuning_run_plots_its_loss_per_epoch_and_density_names_modules(root):
    """A finetuning run from before log_history.json has its epochs.json: the loss per epoch. Density ticks name
    each tensor's layer and module (Q, K, V, O, FFN in / out)."""
    run = root / "runs" / "glue" / "glue_rte" / "run0"
    run.mkdir(parents=True)
    (run / "epochs.json").write_text(json.dumps([{"epoch": 1, "train_loss": 0.69, "eval_loss": 0.7},
                                                 {"epoch": 2, "train_loss": 0.6, "eval_loss": 0.65}]))
    (run / "config.json").write_text(json.dumps({"task": "glue:rte"}))
    assert plot(root, "loss", "glue/glue_rte/run0", root / "finetune.svg") == 0
    svg = (root / "finetune.svg").read_bytes()
    assert b"epoch" in svg and b"optimizer step" not in svg and b"glue/glue_rte/run0 eval" in svg

    report = {"layers": [{"name": f"bert.encoder.layer.{i}.{module}.weight", "sparsity": 0.8}
                         for i in range(2) for module in ("attention.self.query", "attention.output.dense",
                                                          "intermediate.dense", "output.dense")]}
    (root / "runs" / "sparse" / "sparsity.json").write_text(json.dumps(report))
    assert plot(root, "density", "sparse", root / "density.svg") == 0
    svg = (root / "density.svg").read_bytes()
    assert all(label in svg for label in (b"0 Q", b"0 O", b"0 FFN in", b"1 FFN out"))


def test_a_plot_without_matplotlib_names_the_extra_to_install(root, capsys, monkeypatch):
    """matplotlib is the optional plots extra: without it --plot ended in a ModuleNotFoundError traceback."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: importing it fails
    assert plot(root, "loss", "dense", root / "loss.png") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --plot needs matplotlib: pip install 'sparsebert[plots]'"]
    assert sorted(p.name for p in root.iterdir()) == ["runs"]
