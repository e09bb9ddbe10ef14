"""Hub-ready exports (#57): labels in config.json, a model card, 0644 files, and ``--onnx`` checked in ONNX
Runtime. One tiny sparse SST-2 run, built and exported once for the module, with the MiniLM tokenizer."""

from __future__ import annotations

import csv
import json
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    pipeline,
)

from sparsebert.cli import main as cli_main
from sparsebert.export import onnx as onnx_export
from sparsebert.export.model_dir import against_plain_export
from sparsebert.io import _UMASK
from sparsebert.jobs.finetune.glue import load_classifier

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _sst2_rows(data_dir: Path, first: int, n: int) -> tuple[list[str], list[int]]:
    """SST-2 dev sentences and labels ``first`` to ``first + n``."""
    with open(data_dir / "glue" / "SST-2" / "dev.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[first:first + n]
    return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, tokenizer) -> Path:
    """A finished 80 % sparse SST-2 run as an earlier commit saved it: its config says LABEL_0 / LABEL_1, and
    safetensors wrote its weights 0600."""
    root = tmp_path_factory.mktemp("runs")
    run = root / "sst2_exp" / "glue_sst2" / "run0"
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, num_labels=2, **TINY))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".encoder.layer." in name and name.endswith(".weight") and "LayerNorm" not in name:
                p[p.abs() <= p.abs().reshape(-1).kthvalue(int(0.8 * p.numel())).values] = 0
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    (run / "config.json").write_text(json.dumps({
        "name": "sst2_exp", "task": "glue:sst2", "seed": 42, "experiment": "sst2_exp", "model": {"init_from": "minilm"},
        "sparsity": {"sparsity": 0.8, "pattern": "unstructured"}, "finetune": {"learning_rate": 5e-5}}))
    (run / "metrics.json").write_text(json.dumps({"accuracy": 0.8125, "sparsity": 0.8, "label_names": None}))
    (run / "sparsity.json").write_text(json.dumps({"selected": {"sparsity": 0.8}, "layers": []}))
    (root / "sst2_exp" / "env.json").write_text(json.dumps({
        "git_commit": "0123abc", "argv": ["run.py", "sst2_exp", "--set", "sparsity.sparsity=0.8"]}))
    (run / "DONE").write_text("2026-01-01T00:00:00\n")
    return run


@pytest.fixture(scope="module")
def plain_export(sst2_run, tmp_path_factory) -> tuple[Path, str]:
    """``--export RUN --to DIR --onnx``, once: the directory and what the command printed."""
    out = tmp_path_factory.mktemp("exports") / "sst2-sparse80"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli_main(["--export", str(sst2_run), "--to", str(out), "--onnx"]) == 0
    return out, printed.getvalue()


def test_a_pipeline_on_the_export_answers_the_tasks_label_names(plain_export, data_dir):
    out, _ = plain_export
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    texts, _ = _sst2_rows(data_dir, 20, 6)
    answers = pipeline("text-classification", model=str(out), device="cpu")(texts)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    from transformers import AutoTokenizer

    with torch.no_grad():
        logits = model(**AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")).logits
    assert [a["label"] for a in answers] == [("negative", "positive")[i] for i in logits.argmax(-1).tolist()]
    # every file readable by others as the umask allows (safetensors wrote the run's weights 0600)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes and set(modes.values()) == {0o666 & ~_UMASK}, modes
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_UMASK


def test_the_export_has_a_model_card_naming_the_run(plain_export, monkeypatch):
    out, _ = plain_export
    card = (out / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    meta = {k: json.loads(v) for k, v in (line.split(": ", 1) for line in front.strip().splitlines())}
    assert meta["library_name"] == "transformers"
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["pipeline_tag"] == "text-classification"
    assert {"sparsity-80", "glue-sst2"} <= set(meta["tags"])
    for fact in ("| task | glue:sst2 (labels: negative, positive) |", "| sparsity | 80.0 %",
                 "| accuracy | 0.8125 |", "| commit | 0123abc |", "sparsebert sst2_exp --set sparsity.sparsity=0.8",
                 '"learning_rate": 5e-05', "BertForSequenceClassification.from_pretrained(\"sst2-sparse80\")", 'classify = pipeline("text-classification", model="sst2-sparse80")'):
        assert fact in body, fact
    # the card's own code runs, beside the directory, as a user would run it
    monkeypatch.chdir(out.parent)
    scope: dict = {}
    exec(body.split("```python\n")[1].split("```")[0], scope)
    assert type(scope["model"]) is BertForSequenceClassification
    assert scope["classify"]("unflinchingly bleak and desperate")[0]["label"] in {"negative", "positive"}


def test_onnx_runtime_matches_pytorch_on_real_sst2_rows(plain_export, data_dir, tokenizer):
    import onnxruntime

    out, printed = plain_export
    assert "model.onnx matches PyTorch in ONNX Runtime" in printed
    texts, _ = _sst2_rows(data_dir, 40, 5)  # other rows than the command's own check
    batch = tokenizer(texts, padding=True, return_tensors="np")
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run(None, {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.numpy()
    assert onnx_logits.shape == (5, 2) and batch["attention_mask"].min() == 0  # padded rows among them
    assert np.abs(onnx_logits - logits).max() <= 1e-4


def test_an_onnx_export_off_by_more_than_the_tolerance_fails_the_command(sst2_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(onnx_export, "TOLERANCE", -1.0)  # any difference, 0 included, is too much
    assert cli_main(["--export", str(sst2_run), "--to", str(tmp_path / "out"), "--onnx"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # torch.onnx's tracer warnings, then the error
    err = lines[-1]
    assert [line for line in lines if line.startswith("error")] == [err]
    assert err.startswith("error: --onnx: ONNX Runtime differs from PyTorch by ") and "not kept" in err
    assert list(tmp_path.iterdir()) == []  # neither the export nor its temporary directory


def test_compressed_export_reports_whole_directory_sizes(sst2_run, plain_export, tmp_path, capsys):
    out = tmp_path / "compressed"
    assert cli_main(["--export", str(sst2_run), "--to", str(out), "--compressed"]) == 0
    summary = json.loads((out / "compression.json").read_text())
    plain_bytes = sum(p.stat().st_size for p in plain_export[0].iterdir() if p.name != "model.onnx")
    assert summary["dir_bytes"] == sum(p.stat().st_size for p in out.iterdir())
    # the plain export it is compared with: its card names another directory, a few bytes either way
    assert abs(summary["plain_dir_bytes"] - plain_bytes) < 100
    ratio = summary["plain_dir_bytes"] / summary["dir_bytes"]
    assert f"{ratio:.2f}x smaller than the plain export" in capsys.readouterr().out
    assert 1.0 < ratio < 4.0  # the embeddings and the tokenizer are not sparse: far below the tensors' 4.3x
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~_UMASK}


def test_a_compressed_export_that_grew_does_not_say_smaller():
    assert against_plain_export(2_000, 1_000) == "2.00x smaller than the plain export"
    assert against_plain_export(18_390_000, 18_400_000) == "not smaller than the plain export (+10,000 bytes)"


def test_from_pretrained_loads_the_compressed_export_bit_for_bit(sst2_run, plain_export, tmp_path, data_dir,
                                                                tokenizer):
    out = tmp_path / "compressed"
    assert cli_main(["--export", str(sst2_run), "--to", str(out), "--compressed"]) == 0
    assert not (out / "model.safetensors").exists()
    loaded = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True)
    assert type(loaded) is BertForSequenceClassification  # the plain class: nothing of ours stays in the model
    plain = AutoModelForSequenceClassification.from_pretrained(plain_export[0]).eval()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), loaded.state_dict().values(),
                                                  strict=True))
    sentences, _ = _sst2_rows(data_dir, 40, 4)
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, plain(**batch).logits)
    # the reader shipped with the export imports nothing of sparsebert: it loads where sparsebert is not installed
    import ast

    tree = ast.parse((out / "bitmask_loader.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("sparsebert") for m in imported), imported
    assert "trust_remote_code=True" in (out / "README.md").read_text()


def _as_hub_cache(export: Path, cache: Path, repo: str) -> None:
    """``export`` laid out as huggingface_hub caches the repo ``repo`` after a download (offline here)."""
    commit = "0" * 40
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in export.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())


def test_a_compressed_export_loads_from_the_hub_with_its_from_pretrained_arguments(sst2_run, plain_export,
                                                                                   tmp_path, monkeypatch):
    """The card's load line names a Hub repo: the weights come through transformers' cache (cache_dir, revision),
    dtype casts, and an argument the loader cannot honour is refused rather than ignored."""
    out = tmp_path / "compressed"
    assert cli_main(["--export", str(sst2_run), "--to", str(out), "--compressed"]) == 0
    _as_hub_cache(out, tmp_path / "cache", "user/sst2-sparse80")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load = AutoModelForSequenceClassification.from_pretrained
    loaded = load("user/sst2-sparse80", cache_dir=tmp_path / "cache", revision="main", trust_remote_code=True)
    plain = load(plain_export[0])
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), loaded.state_dict().values(),
                                                  strict=True))
    half = load(out, trust_remote_code=True, dtype=torch.float16)
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    with pytest.raises(TypeError, match="takes no .*output_loading_info"):
        load(out, trust_remote_code=True, output_loading_info=True)
    with pytest.raises(TypeError, match="not a map of modules to devices"):
        load(out, trust_remote_code=True, device_map={"": "cpu"})


def test_a_damaged_compressed_file_is_refused_naming_what_is_wrong(tmp_path):
    from safetensors.torch import save_file

    from sparsebert.export.bitmask_loader import FORMAT, read_bitmask_file

    parts = {"w.__mask__": torch.tensor([0b10100000], dtype=torch.uint8), "w.__values__": torch.ones(2)}
    for meta, message in (({"sparsebert_format": FORMAT}, "no readable 'shapes'"),
                          ({"sparsebert_format": FORMAT, "shapes": '{"w": 8}'}, "not a mapping"),
                          ({"sparsebert_format": FORMAT, "shapes": "{}"}, r"no shape for the compressed tensor")):
        save_file(parts, tmp_path / "m.safetensors", metadata=meta)
        with pytest.raises(ValueError, match=message):
            read_bitmask_file(tmp_path / "m.safetensors")
    save_file(parts, tmp_path / "m.safetensors", metadata={"sparsebert_format": FORMAT, "shapes": '{"w": [2, 4]}'})
    assert read_bitmask_file(tmp_path / "m.safetensors")["w"].tolist() == [[1, 0, 1, 0], [0, 0, 0, 0]]


def test_a_classifier_for_a_task_saves_its_label_names(sst2_run, tmp_path):
    """A run saves the labels itself (a run from before this export still gets them: the tests above)."""
    model = load_classifier(str(sst2_run / "model"), 2, False, ("entailment", "not_entailment"))
    model.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}
    assert config["label2id"] == {"entailment": 0, "not_entailment": 1}
