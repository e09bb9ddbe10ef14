"""End-to-end training on CPU: tiny BERT on real Wikipedia files, through the registry, runner and Trainer.

Each run is a few seconds: one corpus file, 64-token blocks, batch 8, 20 optimizer steps.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForMaskedLM, TrainerCallback

from sparsebert.cli import main
from sparsebert.config import ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.export import load_compressed
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.runner import RunOptions, run_experiment
from sparsebert.sparsity import SparsityController, rigl_update_due
from sparsebert.trainer.distillation import hidden_state_loss

FAST = [
    "data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=32", "data.max_seq_length=64",
    "train.global_batch_size=8", "train.max_steps=20", "train.eval_steps=10", "train.save_steps=10",
    "train.logging_steps=2", "train.report_to=[]", "train.warmup_steps=0", "train.save_total_limit=none",
]

pytestmark = pytest.mark.slow


class Interrupt(Exception):
    pass


class StopAt(TrainerCallback):
    """Simulates a crash right after optimizer step ``step`` (after any checkpoint of an earlier step)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Interrupt


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def run(registry, name, out: Path, data_dir: Path, extra=(), resume=False, callbacks=None, overwrite=False):
    cfg = registry.build(name, FAST + list(extra))
    return run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir, resume=resume, overwrite=overwrite),
                          callbacks=callbacks)


def model_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def dense_run(registry, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("dense")
    metrics = run(registry, "bert_tiny_quick", out, data_dir)
    return out, metrics


def test_tiny_run_learns_and_writes_a_finished_run(dense_run):
    out, metrics = dense_run
    run_dir = out / "bert_tiny_quick"
    for name in ("config.json", "env.json", "metrics.json", "DONE", "model/model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert metrics["eval_loss"] < metrics["initial_eval_loss"] - 0.5
    assert math.isclose(metrics["perplexity"], math.exp(metrics["eval_loss"]))
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["train"]["max_steps"] == 20 and saved["data"]["max_seq_length"] == 64 and saved["seed"] == 42
    env = json.loads((run_dir / "env.json").read_text())
    assert env["seed"] == 42 and env["packages"]["transformers"] and env["hardware"]["world_size"] == 1
    assert metrics["global_step"] == 20


def test_same_seed_same_result(registry, data_dir, dense_run, tmp_path):
    _, first = dense_run
    again = run(registry, "bert_tiny_quick", tmp_path, data_dir)
    assert again["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-6)
    a, b = model_weights(dense_run[0] / "bert_tiny_quick"), model_weights(tmp_path / "bert_tiny_quick")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_finished_run_is_skipped_and_unfinished_needs_resume(registry, data_dir, dense_run, tmp_path):
    out, _ = dense_run
    assert run(registry, "bert_tiny_quick", out, data_dir) is None  # DONE: skipped
    with pytest.raises(Interrupt):
        run(registry, "bert_tiny_quick", tmp_path, data_dir, callbacks=[StopAt(15)])
    assert not (tmp_path / "bert_tiny_quick" / "DONE").exists()
    with pytest.raises(SparseBertError, match="unfinished run"):
        run(registry, "bert_tiny_quick", tmp_path, data_dir)
    # --overwrite starts an unfinished run over in an emptied directory and trains to the end (a finished one:
    # tests/test_runner.py)
    stale = tmp_path / "bert_tiny_quick" / "stale.txt"
    stale.write_text("from the interrupted run")
    metrics = run(registry, "bert_tiny_quick", tmp_path, data_dir, overwrite=True)
    assert metrics["global_step"] == 20 and (tmp_path / "bert_tiny_quick" / "DONE").is_file()
    assert not stale.exists()


def test_resume_refuses_a_changed_experiment(registry, data_dir, tmp_path):
    with pytest.raises(Interrupt):
        run(registry, "bert_tiny_quick", tmp_path, data_dir, callbacks=[StopAt(2)])
    with pytest.raises(SparseBertError, match="learning_rate"):
        run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=["train.learning_rate=0.5"], resume=True)


class NaNAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.bert.embeddings.word_embeddings.weight.fill_(float("nan"))


def test_nan_loss_stops_with_a_one_line_error(registry, data_dir, tmp_path):
    with pytest.raises(SparseBertError, match="training loss is nan"):
        run(registry, "bert_tiny_quick", tmp_path, data_dir, callbacks=[NaNAt(3)])
    assert not (tmp_path / "bert_tiny_quick" / "DONE").exists()


# ---- sparse training through the Trainer ----

class CountSparsityUpdates(TrainerCallback):
    """Records the controller's step count after each optimizer step (RigL must not fire per micro-batch)."""

    def __init__(self):
        self.steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def sparse_layers(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in weights.items() if ".encoder.layer." in k and k.endswith(".weight")
            and "LayerNorm" not in k}


def test_gmp_with_rigl_prunes_on_its_schedule_and_moves_weights_between_prunes(registry, data_dir, tmp_path):
    # GMP prunes 0 -> 80 % at steps 4, 8, 12; RigL moves weights every 2 steps until 0.75 x 20 = 15
    extra = ["rigl.update_freq=2", "gmp.begin_step=4", "gmp.end_step=12", "gmp.frequency=4"]
    metrics = run(registry, "sparse_tiny_rigl", tmp_path, data_dir, extra=extra)
    history = json.loads((tmp_path / "sparse_tiny_rigl" / "checkpoint-20" / "trainer_state.json").read_text())
    logged = {h["step"]: h for h in history["log_history"] if "rigl/moved_total" in h or "gmp/sparsity" in h}
    assert [t for t, h in logged.items() if "gmp/sparsity" in h] == [4, 8, 12]
    assert [t for t, h in logged.items() if "rigl/moved_total" in h] == list(range(2, 15, 2))
    assert logged[2]["rigl/moved_total"] == 0  # still dense: nothing to grow into
    assert logged[8]["gmp/sparsity"] == pytest.approx(0.8 * (1 - 0.5**3), abs=1e-3)
    assert all(logged[t]["rigl/moved_total"] > 0 for t in range(8, 15, 2))
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)


def test_obs_pruning_through_the_trainer_with_gradient_accumulation(registry, data_dir, tmp_path):
    # accumulation 4; the Fisher of each prune holds the last 2 optimizer steps' (accumulated) gradients
    extra = ["rigl=null", "gmp.score=obs", "gmp.begin_step=4", "gmp.end_step=12", "gmp.frequency=4",
             "gmp.obs_num_grads=2", "train.per_device_batch_size=2"]
    metrics = run(registry, "sparse_tiny_rigl", tmp_path, data_dir, extra=extra)
    run_dir = tmp_path / "sparse_tiny_rigl"
    history = json.loads((run_dir / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "gmp/sparsity" in h] == [4, 8, 12]
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)
    for name, w in sparse_layers(model_weights(run_dir)).items():
        assert (w == 0).float().mean().item() == pytest.approx(0.8, abs=2e-3), name


def test_rigl_with_gradient_accumulation_updates_once_per_optimizer_step(registry, data_dir, tmp_path):
    extra = ["train.per_device_batch_size=2", "rigl.update_freq=2", "rigl.end_fraction=1.0"]  # accumulation 4
    metrics = run(registry, "sparse_tiny_rigl", tmp_path, data_dir, extra=extra)
    run_dir = tmp_path / "sparse_tiny_rigl"
    history = json.loads((run_dir / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    updates = [h["step"] for h in history if "rigl/drop_fraction" in h]
    state = json.loads((run_dir / "checkpoint-20" / "sparsity_state.json").read_text())
    assert state["step"] == 20  # optimizer steps, not 80 micro-batches
    cfg = registry.build("sparse_tiny_rigl", FAST + extra)
    due = [t for t in range(1, 21) if rigl_update_due(t, cfg.rigl, 20)]
    assert due == list(range(2, 20, 2))
    assert updates == due  # logging every 2 steps: each update shows at its own step, none in between
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)
    # exported weights: every encoder Linear exactly 80 % zeros
    for name, w in sparse_layers(model_weights(run_dir)).items():
        assert (w == 0).float().mean().item() == pytest.approx(0.8, abs=2e-3), name
    report = json.loads((run_dir / "sparsity.json").read_text())
    assert "embeddings dense" in report["headline"]


def crash_before_trainer_state(monkeypatch, step: int) -> None:
    """Simulates a crash while checkpoint-``step`` is saved: weights, optimizer state and masks are written,
    trainer_state.json (the Trainer writes it last, before deleting older checkpoints) is not."""
    from transformers import TrainerState

    save = TrainerState.save_to_json

    def crashing(self, json_path):
        if Path(json_path).parent.name == f"checkpoint-{step}":
            raise Interrupt
        save(self, json_path)

    monkeypatch.setattr(TrainerState, "save_to_json", crashing)


def test_sparse_resume_skips_a_checkpoint_without_trainer_state(registry, data_dir, tmp_path, caplog, monkeypatch):
    with monkeypatch.context() as patch:
        crash_before_trainer_state(patch, 20)
        with pytest.raises(Interrupt):
            run(registry, "sparse_tiny_rigl", tmp_path, data_dir)
    run_dir = tmp_path / "sparse_tiny_rigl"
    # the masks went in with the optimizer state, before trainer_state.json (with save_total_limit=1 the older
    # checkpoint is deleted right after it: masks written later left no complete checkpoint for a while)
    assert (run_dir / "checkpoint-20" / "masks.safetensors").is_file()
    assert not (run_dir / "checkpoint-20" / "trainer_state.json").exists()
    steps = CountSparsityUpdates()
    with caplog.at_level("WARNING", logger="sparsebert.jobs.pretrain"):
        resumed = run(registry, "sparse_tiny_rigl", tmp_path, data_dir, resume=True, callbacks=[steps])
    assert "skipping the incomplete checkpoint" in caplog.text and "checkpoint-20" in caplog.text
    assert steps.steps == list(range(11, 21))  # continued from checkpoint-10
    assert resumed["global_step"] == 20 and (run_dir / "DONE").is_file()
    assert resumed["sparsity"] == pytest.approx(0.8, abs=1e-4)
    assert (run_dir / "checkpoint-20" / "trainer_state.json").is_file()  # saved again, whole this time


def test_export_reload_keeps_sparsity(registry, data_dir, tmp_path):
    run(registry, "sparse_tiny_rigl", tmp_path, data_dir)
    model = BertForMaskedLMAtMasked.from_pretrained(tmp_path / "sparse_tiny_rigl" / "model")
    cfg = registry.build("sparse_tiny_rigl", FAST)
    controller = SparsityController.from_zeros(model, cfg.sparsity)
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert len(controller.masks) == 12
    # the compressed export of the sparse MLM run loads back as transformers' BertForMaskedLM, the same model
    out = tmp_path / "compressed"
    assert main(["--export", str(tmp_path / "sparse_tiny_rigl"), "--to", str(out), "--compressed"]) == 0
    loaded = load_compressed(out)
    assert type(loaded) is BertForMaskedLM
    reference = BertForMaskedLM.from_pretrained(tmp_path / "sparse_tiny_rigl" / "model").eval()
    a, b = loaded.state_dict(), reference.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    batch = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=batch).logits, reference(input_ids=batch).logits)


def test_pretraining_continued_from_a_sparse_run_keeps_its_masks(registry, data_dir, tmp_path):
    """A continuation without a sparsity section of its own trains with the sparse run's masks fixed, and says so in
    its config.json, where a model finetuned from it finds them; trained dense, the zeros would grow back."""
    run(registry, "sparse_tiny_rigl", tmp_path, data_dir)
    run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=["model.init_from=sparse_tiny_rigl"])
    start = sparse_layers(model_weights(tmp_path / "sparse_tiny_rigl"))
    continued = model_weights(tmp_path / "bert_tiny_quick")
    assert len(start) == 12
    for name, weight in start.items():
        assert torch.equal(continued[name] == 0, weight == 0), name
        assert not torch.equal(continued[name], weight), name  # trained, on the same mask
    section = json.loads((tmp_path / "bert_tiny_quick" / "config.json").read_text())["sparsity"]
    assert (section["sparsity"], section["init"]) == (0.8, "zeros")
    metrics = json.loads((tmp_path / "bert_tiny_quick" / "metrics.json").read_text())
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-3)


@pytest.fixture(scope="module")
def kd_run(registry, data_dir, dense_run):
    """The sparse KD run, distilled from the dense run, in the same output root."""
    out, _ = dense_run
    return out, run(registry, "sparse_tiny_kd_onecycle_lr_rigl", out, data_dir)


def test_kd_onecycle_rigl_runs_with_the_dense_run_as_teacher(kd_run):
    out, metrics = kd_run
    run_dir = out / "sparse_tiny_kd_onecycle_lr_rigl"
    history = json.loads((run_dir / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    lrs = [h["learning_rate"] for h in history if "learning_rate" in h]
    peak = max(lrs)
    assert peak == pytest.approx(2e-3, rel=0.3)  # one-cycle: rises to max_lr, then anneals far below it
    assert lrs.index(peak) not in (0, len(lrs) - 1) and lrs[-1] < peak / 100
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)
    assert math.isfinite(metrics["eval_loss"])


def test_kd_hidden_states_pull_the_student_towards_the_teacher(registry, data_dir, dense_run, kd_run, tmp_path):
    """kd.hidden_weight in a real run: it trains, and its student's layers end closer to the teacher's than those
    of the same run (same seed and data) without the term."""
    out, _ = dense_run
    teacher_dir = out / "bert_tiny_quick"
    metrics = run(registry, "sparse_tiny_kd_onecycle_lr_rigl", tmp_path, data_dir,
                  extra=[f"kd.teacher={teacher_dir}", "kd.hidden_weight=1.0"])
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4) and math.isfinite(metrics["eval_loss"])
    ids = torch.randint(1000, 3000, (4, 64), generator=torch.Generator().manual_seed(0))

    def states(model_dir: Path):
        model = BertForMaskedLMAtMasked.from_pretrained(model_dir).eval()
        with torch.no_grad():
            return model(input_ids=ids, output_hidden_states=True).hidden_states

    teacher = states(teacher_dir / "model")
    with_term = hidden_state_loss(states(tmp_path / "sparse_tiny_kd_onecycle_lr_rigl" / "model"), teacher)
    without = hidden_state_loss(states(out / "sparse_tiny_kd_onecycle_lr_rigl" / "model"), teacher)
    assert with_term < 0.8 * without


def test_kd_trains_in_fp8_beside_its_bf16_teacher(registry, data_dir, kd_run, tmp_path, monkeypatch):
    """train.precision=fp8 with distillation (torchao's emulation on CPU: FP8 casts, fp32 products): the student's
    encoder multiplies in FP8, the teacher stays a plain bf16 model, masked weights stay exact zeros, and the run
    ends where the same run in fp32 does (same seed and data), not at the same numbers."""
    from functools import partial

    from torchao.float8.float8_linear import Float8Linear

    import sparsebert.models.precision as precision
    import sparsebert.models.prepare as prepare
    import sparsebert.trainer.trainer as trainer_module
    from sparsebert.models.fp8 import use_fp8_matmuls

    monkeypatch.setattr(precision, "fp8_unavailable_reason", lambda: None)
    monkeypatch.setattr(prepare, "use_fp8_matmuls", partial(use_fp8_matmuls, emulate=True))
    teachers = []
    original = trainer_module.prepare_teacher

    def record(teacher, *args):
        teachers.append(original(teacher, *args))
        return teachers[-1]

    monkeypatch.setattr(trainer_module, "prepare_teacher", record)
    students = []

    class Student(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            students.append(sum(isinstance(m, Float8Linear) for m in model.modules()))

    out, fp32 = kd_run
    metrics = run(registry, "sparse_tiny_kd_onecycle_lr_rigl", tmp_path, data_dir, callbacks=[Student()],
                  extra=[f"kd.teacher={out / 'bert_tiny_quick'}", "train.precision=fp8"])
    assert students == [12]  # Q, K, V, attention output, FFN in and out, in each of the 2 layers
    (teacher,) = teachers
    assert not any(isinstance(m, Float8Linear) for m in teacher.modules())
    assert {p.dtype for p in teacher.parameters()} == {torch.bfloat16}
    weights = model_weights(tmp_path / "sparse_tiny_kd_onecycle_lr_rigl")
    encoder = [t for n, t in weights.items() if ".encoder.layer." in n and t.dim() == 2]
    assert sum(int((t == 0).sum()) for t in encoder) / sum(t.numel() for t in encoder) == pytest.approx(0.8, abs=1e-4)
    # it learned (10.35 -> 8.83 nats) and ended within 0.01 of fp32 (1e-4 apart when written)
    assert metrics["eval_loss"] < metrics["initial_eval_loss"] - 1
    assert metrics["eval_loss"] == pytest.approx(fp32["eval_loss"], abs=0.01)
    assert metrics["eval_loss"] != fp32["eval_loss"]


def test_plots_of_finished_runs(dense_run, kd_run, tmp_path):
    """--plot loss reads each run's log_history.json; --plot density its sparsity.json; both write a PNG."""
    out, metrics = dense_run
    history = json.loads((out / "bert_tiny_quick" / "log_history.json").read_text())
    assert [h["eval_loss"] for h in history if "eval_loss" in h][-1] == pytest.approx(metrics["eval_loss"])
    runs = ["bert_tiny_quick", "sparse_tiny_kd_onecycle_lr_rigl"]
    png = b"\x89PNG\r\n\x1a\n"
    assert main(["--output-dir", str(out), "--plot", "loss", "--only", *runs,
                 "--out", str(tmp_path / "loss.png")]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == png
    assert main(["--output-dir", str(out), "--plot", "density", "--only", runs[1],
                 "--out", str(tmp_path / "density.png")]) == 0
    assert (tmp_path / "density.png").read_bytes()[:8] == png
    # a dense run has no sparsity report: one line naming the missing file, exit 2
    assert main(["--output-dir", str(out), "--plot", "density", "--only", runs[0]]) == 2


def test_trackers_write_locally_and_wandb_never_blocks(registry, data_dir, tmp_path, monkeypatch):
    """tensorboard event files in the run dir; wandb without credentials runs offline instead of prompting. Both
    get the experiment's own sections and the masks' density over time; the W&B project is the experiment's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import sparsebert.trainer.tracking

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(sparsebert.trainer.tracking, "USER_WANDB_PROJECT", None)
    monkeypatch.setattr(sparsebert.trainer.tracking, "USER_WANDB_DIR", None)
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))  # nor a `wandb login` of whoever runs the tests
    for name in ("WANDB_DIR", "WANDB_PROJECT"):  # restored after the test: training_arguments sets them
        monkeypatch.setenv(name, "")
    run(registry, "sparse_tiny_rigl", tmp_path, data_dir, extra=["train.report_to=tensorboard,wandb",
                                                                 "train.max_steps=4", "train.logging_steps=2",
                                                                 "rigl.update_freq=2"])
    import wandb

    # what the run holds and sends: this wandb writes no files/config.yaml offline, and has no Python reader for
    # its .wandb records (wandb-core writes them behind finish())
    config, summary = dict(wandb.run.config), dict(wandb.run.summary)
    names = (wandb.run.project, wandb.run.name)
    wandb.finish()  # what the process's exit, or the next run's Trainer, does
    (offline,) = (tmp_path / "sparse_tiny_rigl").rglob("offline-run-*")  # W&B's files in the run's directory
    experiment = config["experiment"]
    assert experiment["name"] == "sparse_tiny_rigl" and experiment["sparsity"]["sparsity"] == 0.8
    assert experiment["rigl"]["update_freq"] == 2
    assert summary["train/density"] == pytest.approx(0.2, abs=0.01)
    assert summary["train/density/layer_0_Q"] == pytest.approx(0.2, abs=0.05)
    assert names == ("sparse_tiny_rigl", "sparse_tiny_rigl")  # not transformers' "huggingface"
    # the records `wandb sync` uploads (wandb-core writes them; no Python reader here): the config's sections and
    # the density series are in them
    (records,) = offline.glob("run-*.wandb")
    expected = (b'"sparsity"', b'"rigl"', b"train/density/layer_0_Q")
    deadline = time.monotonic() + 60  # finish() can return before wandb-core's writer has flushed (a busy CI host)
    while not all(part in (raw := records.read_bytes()) for part in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(part in raw for part in expected), raw[:200]

    (events,) = [p for p in (tmp_path / "sparse_tiny_rigl").rglob("events.out.tfevents.*")
                 if p.parent.name != "experiment"]  # the training run's; experiment/ holds the hparams
    tensorboard = EventAccumulator(str(events.parent)).Reload()
    assert [e.step for e in tensorboard.Scalars("train/density")] == [1, 2, 4]
    assert "train/density/layer_1_FFN_out" in tensorboard.Tags()["scalars"]
    text = tensorboard.Tensors("experiment/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n"))["rigl"]["update_freq"] == 2


def test_profile_writes_a_trace_of_steps_after_warmup(registry, data_dir, tmp_path):
    from sparsebert.trainer.profiling import ProfilerCallback

    profiler = ProfilerCallback(warmup=2, steps=2)
    run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=["train.max_steps=6"], callbacks=[profiler])
    start, end = profiler.window  # the profiled steps' wall-clock span (benches sample GPU clocks over it)
    assert 0 < end - start < 60
    profile = tmp_path / "bert_tiny_quick" / "profile"
    trace = json.loads((profile / "trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("Optimizer.step" in n for n in names)  # real training steps were recorded
    assert "aten::" in (profile / "top_ops.txt").read_text()


def test_stop_after_steps_ends_early_on_the_full_runs_schedule(registry, data_dir, dense_run, tmp_path):
    metrics = run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=["train.stop_after_steps=7"])
    assert metrics["global_step"] == 7
    stopped = json.loads((tmp_path / "bert_tiny_quick" / "log_history.json").read_text())
    full = json.loads((dense_run[0] / "bert_tiny_quick" / "log_history.json").read_text())
    assert [h["step"] for h in stopped if "eval_loss" in h] == [0, 7]  # evaluated where it stopped
    # the same steps as the 20-step run up to the stop: its LR schedule (warm-up, decay to step 20) is not shortened
    train_logs = {h["step"]: h for h in full if "loss" in h}
    for entry in (h for h in stopped if "loss" in h):
        assert entry["learning_rate"] == train_logs[entry["step"]]["learning_rate"]
        assert entry["loss"] == pytest.approx(train_logs[entry["step"]]["loss"], abs=1e-6)
    assert stopped[-1]["step"] == 7 and (tmp_path / "bert_tiny_quick" / "DONE").is_file()
    # samples/s of the 7 steps that ran (transformers 5.17's own figure counts the whole 20-step schedule)
    assert metrics["train_samples_per_second"] == pytest.approx(7 * 8 / metrics["train_runtime_s"])


def test_a_gmp_run_stopped_early_exports_the_sparsity_it_was_evaluated_at(registry, data_dir, tmp_path):
    """train.stop_after_steps ends GMP (0 -> 80 % at steps 4, 8, 12 of 20) at step 9: the model keeps the sparsity
    of its last prune (step 8), the one the evaluation at step 9 saw, not the target without the recovery steps."""
    extra = ["rigl=null", "gmp.begin_step=4", "gmp.end_step=12", "gmp.frequency=4", "train.stop_after_steps=9"]
    metrics = run(registry, "sparse_tiny_rigl", tmp_path, data_dir, extra=extra)
    assert metrics["global_step"] == 9
    at_step_8 = 0.8 * (1 - 0.5**3)
    assert metrics["sparsity"] == pytest.approx(at_step_8, abs=1e-3)
    report = json.loads((tmp_path / "sparse_tiny_rigl" / "sparsity.json").read_text())
    assert report["selected"]["sparsity"] == pytest.approx(at_step_8, abs=1e-3)
    for name, w in sparse_layers(model_weights(tmp_path / "sparse_tiny_rigl")).items():  # the exported model too
        assert (w == 0).float().mean().item() == pytest.approx(at_step_8, abs=5e-3), name


def test_resume_of_a_stopped_run_never_trains_past_the_stop(registry, data_dir, tmp_path):
    """A checkpoint saved at the stop step is not resumed from: the stop can only act after a step."""
    stop = ["train.stop_after_steps=10"]  # FAST saves at step 10 too
    run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=stop)
    run_dir = tmp_path / "bert_tiny_quick"
    assert (run_dir / "checkpoint-10").is_dir()
    (run_dir / "DONE").unlink()  # killed after the checkpoint, before it finished
    metrics = run(registry, "bert_tiny_quick", tmp_path, data_dir, extra=stop, resume=True)
    assert metrics["global_step"] == 10
    evals = [h["step"] for h in json.loads((run_dir / "log_history.json").read_text()) if "eval_loss" in h]
    assert evals[-1] == 10 and max(evals) == 10


def test_a_finished_run_leaves_no_loader_workers_behind(registry, data_dir, tmp_path):
    """The training loader's workers outlive epochs; when the run ends they end too, so the next experiment of a
    `run.py A B` sequence does not train beside them."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    run(registry, "bert_tiny_quick", tmp_path, data_dir, ["train.dataloader_workers=2", "train.max_steps=6"])
    assert set(multiprocessing.active_children()) - before == set()
