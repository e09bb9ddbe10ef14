"""``run.py --export``: plain and compressed (bitmask + values) model directories, bit-exact round trips."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)

from sparsebert.cli import main as cli_main
from sparsebert.errors import SparseBertError
from sparsebert.export import (
    compress_state_dict,
    decompress_state_dict,
    decompress_tensors,
    load_compressed,
    pack_bits,
    unpack_bits,
)
from sparsebert.export.bitmask_loader import MASK_SUFFIX, VALUES_SUFFIX, WEIGHTS_NAME
from sparsebert.io import _UMASK
from sparsebert.jobs.finetune.gap import load_gap_model
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.gap_heads import HEADS as GAP_HEADS
from sparsebert.models.gap_heads import GapClassifier
from sparsebert.results import RunRecord, RunRegistry
from sparsebert.results.recording import run_key

ENCODER_LINEAR = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                  "intermediate.dense", "output.dense")


def _is_encoder_linear_weight(name: str) -> bool:
    return ".encoder.layer." in name and name.endswith(".weight") and any(k in name for k in ENCODER_LINEAR) \
        and "LayerNorm" not in name


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype and shape, torch.equal (where no NaN, which equals nothing, is involved), and the same bytes
    once the sign of zeros is dropped (the one thing the format does not keep: see sparsebert.export.compressed)."""
    def raw(t: torch.Tensor) -> list[int]:
        t = torch.where(t == 0, torch.zeros_like(t), t) if t.is_floating_point() else t
        return t.contiguous().view(torch.uint8).reshape(-1).tolist()

    has_nan = a.is_floating_point() and bool(a.isnan().any())
    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b) and (has_nan or torch.equal(a, b))


def _encoder_ratio(dense: dict[str, torch.Tensor], packed_file: Path) -> float:
    """Bytes of the encoder Linear weights dense / as stored compressed (mask + values)."""
    packed = load_file(str(packed_file))
    names = [n for n in dense if _is_encoder_linear_weight(n)]
    assert names
    dense_bytes = sum(dense[n].numel() * dense[n].element_size() for n in names)
    packed_bytes = sum(packed[n + s].numel() * packed[n + s].element_size()
                       for n in names for s in (MASK_SUFFIX, VALUES_SUFFIX))
    return dense_bytes / packed_bytes


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 64, 1001])
def test_pack_bits_is_numpy_packbits(numel: int) -> None:
    flags = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.5
    packed = pack_bits(flags)
    assert packed.dtype == torch.uint8
    assert packed.numpy().tolist() == np.packbits(flags.numpy()).tolist()
    assert torch.equal(unpack_bits(packed, numel), flags)


def test_compression_round_trip_is_bit_exact_for_every_dtype() -> None:
    g = torch.Generator().manual_seed(0)
    state = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        t = torch.randn(13, 11, generator=g).to(dtype)
        t[torch.rand(13, 11, generator=g) < 0.8] = 0
        t[0, 0], t[0, 1], t[0, 2] = -0.0, float("nan"), float("inf")  # -0.0 comes back as 0.0: torch.equal
        state[f"w_{dtype}".replace("torch.", "")] = t
    state["bias"] = torch.zeros(11)  # 1-D: stored as is
    state["dense"] = torch.randn(4, 4, generator=g)  # no zeros: stored as is
    state["ids"] = torch.tensor([[0, 0, 0, 5]])  # integers are compressed too when mostly zero
    tensors, shapes = compress_state_dict(state)
    assert set(shapes) == {"w_float32", "w_float16", "w_bfloat16", "w_float64", "ids"}
    assert {"bias", "dense"} <= set(tensors)
    back = decompress_tensors(tensors, shapes)
    assert set(back) == set(state)
    for name, t in state.items():
        assert _bits_equal(back[name], t), name
    assert torch.equal(back["w_float32"][0, 3:], state["w_float32"][0, 3:])
    nan = back["w_float32"][0, 1].view(torch.int32)  # a NaN is a value: its payload survives
    assert nan == state["w_float32"][0, 1].view(torch.int32)


TINY_BERT = {"vocab_size": 200, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 128}


def _sparsify(model: torch.nn.Module, sparsity: float = 0.8) -> torch.nn.Module:
    """``model`` with its encoder Linear weights ``sparsity`` zeros (smallest magnitudes, per layer), as a sparse
    run leaves them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if _is_encoder_linear_weight(name):
                k = int(sparsity * p.numel())
                threshold = p.abs().reshape(-1).kthvalue(k).values
                p[p.abs() <= threshold] = 0
    return model


def _sparse_classifier(sparsity: float = 0.8) -> BertForSequenceClassification:
    """A tiny BERT classifier, ``sparsity`` sparse."""
    torch.manual_seed(0)
    return _sparsify(BertForSequenceClassification(BertConfig(**TINY_BERT, num_labels=2)), sparsity)


def _fake_finished_run(root: Path, name: str = "exp/glue_rte/run0", done: bool = True) -> Path:
    """A finetuning run directory as finish_run leaves it: model/, config.json, sparsity.json, DONE."""
    run = root / name
    _sparse_classifier().save_pretrained(run / "model")
    (run / "model" / "training_args.bin").write_bytes(b"a pickle the export leaves out")
    (run / "config.json").write_text(json.dumps({"task": "glue:rte", "seed": 42, "experiment": "exp"}))
    (run / "sparsity.json").write_text(json.dumps({"selected": {"sparsity": 0.8}, "layers": []}))
    if done:
        (run / "DONE").write_text("2024-01-01T00:00:00\n")
    return run


def test_compressed_export_round_trip_and_size(tmp_path: Path, capsys) -> None:
    run = _fake_finished_run(tmp_path / "runs")
    out = tmp_path / "export"
    assert cli_main(["--export", "exp/glue_rte/run0", "--to", str(out), "--compressed",
                     "--output-dir", str(tmp_path / "runs")]) == 0
    assert "exported" in capsys.readouterr().out
    files = {p.name for p in out.iterdir()}
    assert {WEIGHTS_NAME, "config.json", "compression.json", "README.md"} <= files
    assert "model.safetensors" not in files and "training_args.bin" not in files
    assert "load_compressed" in (out / "README.md").read_text()

    original = load_file(str(run / "model" / "model.safetensors"))
    restored = decompress_state_dict(out)
    assert set(restored) == set(original)
    for name, t in original.items():
        assert _bits_equal(restored[name], t), name
    ratio = _encoder_ratio(original, out / WEIGHTS_NAME)
    assert ratio >= 4.0, ratio  # fp32 at 80 %: 4 / (1/8 + 0.2 * 4) = 4.3x

    model = load_compressed(out)
    reference = BertForSequenceClassification.from_pretrained(run / "model")
    assert type(model) is BertForSequenceClassification
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert _bits_equal(a, b), name
    # the compressed directory is not mistaken for a dense one: from_pretrained finds no weights
    with pytest.raises(OSError):
        AutoModelForSequenceClassification.from_pretrained(out)


def test_plain_export_loads_with_from_pretrained(tmp_path: Path) -> None:
    run = _fake_finished_run(tmp_path / "runs")
    out = tmp_path / "plain"
    out.mkdir()  # an empty directory may be the target
    assert cli_main(["--export", str(run), "--to", str(out)]) == 0
    model = BertForSequenceClassification.from_pretrained(out)
    reference = BertForSequenceClassification.from_pretrained(run / "model")
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not (out / "training_args.bin").exists()
    with pytest.raises(SparseBertError, match="not a compressed export"):
        decompress_state_dict(out)


def test_refusals_are_one_line_errors(tmp_path: Path, capsys) -> None:
    root = tmp_path / "runs"
    _fake_finished_run(root)
    _fake_finished_run(root, "exp/glue_rte/run1", done=False)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    # a file where --to's parent directory must go: unwritable for root too (chmod stops nothing as root, CI's user)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file\n")
    cases = [
        (["--export", "exp/glue_rte/run0", "--to", str(blocker / "sub" / "out")],
         f"--to {blocker / 'sub' / 'out'}: cannot write in {blocker / 'sub'}: Not a directory"),
        (["--export", "nope", "--to", str(tmp_path / "a")], "no such run"),
        (["--export", "exp/glue_rte/run1", "--to", str(tmp_path / "a")], "has not finished"),
        (["--export", "exp", "--to", str(tmp_path / "a")], "name one, e.g. exp/glue_rte/run0"),
        (["--export", "exp/glue_rte/run0", "--to", str(taken)], "not an empty directory"),
        (["--export", "exp/glue_rte/run0"], "--export RUN and --to DIR go together"),
        (["--compressed", "--to", str(tmp_path / "a")], "--export RUN and --to DIR go together"),
        (["--export", "exp/glue_rte/run0", "--to", str(tmp_path / "a"), "--onnx", "--compressed"],
         "--onnx goes with the plain export"),
        (["--export", "exp/glue_rte/run0", "--to", str(tmp_path / "a"), "--onnx"], "model/ has no tokenizer"),
    ]
    capsys.readouterr()  # save_pretrained's progress bars
    for argv, message in cases:
        assert cli_main([*argv, "--output-dir", str(root)]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (argv, err)
    assert not (tmp_path / "a").exists() and blocker.read_text() == "a file\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


@pytest.mark.parametrize("status, error, says", [
    ("failed", "terminated by SIGTERM", "did not finish: terminated by SIGTERM"),
    ("running", None, "has not finished: the registry has it running (still training, or killed)"),
    (None, None, "has not finished (no DONE file)"),
])
def test_an_unfinished_run_is_refused_saying_why_and_to_resume_it(tmp_path: Path, capsys, status, error, says):
    """A pretraining run stopped before its end has no model/ yet: it is unfinished, not a run that saves none."""
    root = tmp_path / "runs"
    run = root / "bert_tiny_quick"
    (run / "checkpoint-50").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": "mlm"}))
    if status is not None:
        RunRegistry.in_output_root(root).record(RunRecord(run_dir=run_key(run), experiment="bert_tiny_quick", task="mlm",
                                                      model="tiny", seed=42, status=status, error=error))
    for name in ("bert_tiny_quick", str(run)):  # by its name under the output root, and by its path
        assert cli_main(["--export", name, "--to", str(tmp_path / "out"), "--output-dir", str(root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --export {name}: {run} {says}; finish it with --resume (the command that started "
                       "it, plus --resume), then export it"]
    assert not (tmp_path / "out").exists()


def test_a_finished_run_without_a_model_is_refused_naming_the_setting(tmp_path: Path, capsys):
    run = tmp_path / "exp" / "glue_rte" / "run0"
    run.mkdir(parents=True)
    (run / "DONE").write_text("2024-01-01T00:00:00\n")
    assert cli_main(["--export", str(run), "--to", str(tmp_path / "out")]) == 2
    assert "finished without saving its model (finetune.save_model off?)" in capsys.readouterr().err


@pytest.mark.slow
def test_export_of_a_real_sparse_finetuning_run(data_dir, tmp_path: Path, capsys) -> None:
    """A real tiny run (MiniLM on 32 RTE rows, 80 % unstructured sparse) exported through the CLI."""
    from sparsebert.config import ExperimentRegistry
    from sparsebert.results import RunRegistry
    from sparsebert.runner import RunOptions, run_experiment

    cfg = ExperimentRegistry.builtin().build("tiny_glue_2to4", [
        "finetune.max_train_samples=32", "finetune.max_eval_samples=16", "sparsity.sparsity=0.8", "sparsity.pattern=unstructured"])
    root = tmp_path / "runs"
    run_experiment(cfg, RunOptions(output_root=root, data_dir=data_dir))
    run = root / "tiny_glue_2to4" / "glue_rte" / "run0"
    (record,) = RunRegistry.in_output_root(root).runs(status=None)
    assert (record.status, record.run_dir) == ("done", str(run.resolve()))
    # the run saves its task's labels, and its weights readable as the umask allows (safetensors writes 0600)
    assert json.loads((run / "model" / "config.json").read_text())["id2label"] == {"0": "entailment",
                                                                                   "1": "not_entailment"}
    assert stat.S_IMODE((run / "model" / "model.safetensors").stat().st_mode) == 0o666 & ~_UMASK

    out = tmp_path / "export"
    assert cli_main(["--export", "tiny_glue_2to4/glue_rte/run0", "--to", str(out), "--compressed",
                     "--output-dir", str(root)]) == 0
    print(capsys.readouterr().out)
    original = load_file(str(run / "model" / "model.safetensors"))
    restored = decompress_state_dict(out)
    assert set(restored) == set(original) and all(_bits_equal(restored[n], t) for n, t in original.items())
    ratio = _encoder_ratio(original, out / WEIGHTS_NAME)
    summary = json.loads((out / "compression.json").read_text())
    print(f"encoder Linear weights {ratio:.2f}x smaller; whole file {summary['dense_bytes']} -> "
          f"{summary['packed_bytes']} bytes")
    assert ratio >= 4.0
    assert all(any(n.startswith(c) for c in summary["compressed_tensors"]) for n in original
               if _is_encoder_linear_weight(n))
    model = load_compressed(out)
    reference = AutoModelForSequenceClassification.from_pretrained(run / "model")
    batch = {"input_ids": torch.tensor([[101, 2023, 2003, 102]]), "attention_mask": torch.ones(1, 4, dtype=int)}
    with torch.no_grad():
        logits = model(**batch).logits
        assert torch.equal(logits, reference.eval()(**batch).logits) and math.isfinite(float(logits.sum()))


# every task the library trains: the model class its run saves (transformers' own, our MLM fast path, or the GAP
# heads), the run's task, and the class the export's config must name
TASK_MODELS = {
    "mlm": (lambda c: BertForMaskedLMAtMasked(c), "mlm", "BertForMaskedLM"),
    "glue classification": (lambda c: BertForSequenceClassification(c), "glue:rte", "BertForSequenceClassification"),
    "glue regression": (lambda c: BertForSequenceClassification(BertConfig(**TINY_BERT, num_labels=1,
                                                                           problem_type="regression")),
                        "glue:stsb", "BertForSequenceClassification"),
    "squad": (lambda c: BertForQuestionAnswering(c), "squad_v1", "BertForQuestionAnswering"),
    "csv": (lambda c: BertForSequenceClassification(BertConfig(**TINY_BERT, id2label={0: "neg", 1: "mid", 2: "pos"})),
            "csv", "BertForSequenceClassification"),
    **{f"gap {head}": (lambda c, head=head: GapClassifier(BertModel(c), head), "gap", "GapClassifier")
       for head in GAP_HEADS},
}


def _finished_task_run(root: Path, task: str) -> tuple[Path, torch.nn.Module]:
    """A finished run of ``task`` as the Trainer leaves it (a GAP run: the state dict alone, the encoder it
    started from elsewhere) and its model as the run would load it."""
    build, run_task, _ = TASK_MODELS[task]
    torch.manual_seed(0)
    model = _sparsify(build(BertConfig(**TINY_BERT)))
    run = root / "exp" / "run0"
    config = {"task": run_task, "seed": 42, "experiment": "exp"}
    if isinstance(model, GapClassifier):
        encoder = root / "encoder"  # the config of the model the run started from (model_source)
        BertConfig(**TINY_BERT).save_pretrained(encoder)
        (run / "model").mkdir(parents=True)
        save_file(model.state_dict(), str(run / "model" / "model.safetensors"))
        config.update({"model_source": str(encoder), "finetune": {"gap_head": model.head}})
        model = load_gap_model(run / "model", model.head, str(encoder))
    else:
        model.save_pretrained(run / "model")
        model = getattr(transformers, TASK_MODELS[task][2]).from_pretrained(run / "model")
    (run / "config.json").write_text(json.dumps(config))
    (run / "DONE").write_text("2024-01-01T00:00:00\n")
    return run, model


@pytest.mark.parametrize("task", TASK_MODELS)
def test_a_compressed_export_of_every_task_loads_into_the_class_its_config_names(tmp_path: Path, task: str):
    """Bit for bit, whatever the run trained: the MLM fast path's export names transformers' BertForMaskedLM (same
    weights; its tied decoder bias comes back through the tie), a GAP run's export gets a config of its own."""
    run, reference = _finished_task_run(tmp_path / "runs", task)
    out, plain = tmp_path / "compressed", tmp_path / "plain"
    for to, flags in ((out, ["--compressed"]), (plain, [])):
        assert cli_main(["--export", str(run), "--to", str(to), *flags]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [TASK_MODELS[task][2]]
    assert json.loads((plain / "config.json").read_text())["architectures"] == config["architectures"]
    # the task's labels, whatever the run saved (a CSV run's come from its metrics.json, absent here: kept)
    expected = {"glue classification": ["entailment", "not_entailment"], "glue regression": ["similarity"],
                "csv": ["neg", "mid", "pos"]}.get(task, ["A", "B", "neither"] if task.startswith("gap") else None)
    if expected is not None:
        assert list(config["id2label"].values()) == expected
        assert f"(labels: {', '.join(expected)})" in (plain / "README.md").read_text()
    else:  # MLM, SQuAD: no classes
        assert "labels:" not in (plain / "README.md").read_text()
    model = load_compressed(out)
    assert type(model).__name__ == config["architectures"][0]
    loaded, expected = model.state_dict(), reference.state_dict()
    assert list(loaded) == list(expected)
    assert [name for name in expected if not _bits_equal(loaded[name], expected[name])] == []
    assert decompress_state_dict(out).keys() == load_file(str(run / "model" / "model.safetensors")).keys()


def test_an_mlm_export_made_before_its_config_named_transformers_class_still_loads(tmp_path: Path):
    run, reference = _finished_task_run(tmp_path / "runs", "mlm")
    out = tmp_path / "out"
    assert cli_main(["--export", str(run), "--to", str(out), "--compressed"]) == 0
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLMAtMasked"]}))
    model = load_compressed(out)
    assert type(model) is BertForMaskedLM
    a, b = model.state_dict(), reference.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
