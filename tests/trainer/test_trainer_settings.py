"""Trainer settings that cut host time per step.

- DistributedDataParallel: train.ddp reaches the Trainer and Accelerate, and every model sparsebert trains uses all
  of its parameters in the loss, which is what lets DDP run with find_unused_parameters=False (no autograd-graph
  walk after each forward). A parameter left out would make DDP fail at the second step of a multi-GPU run.
- The FLOP count the Trainer adds up every step is the Trainer's own, with the parameter count taken once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertModel

from sparsebert.config import ExperimentRegistry
from sparsebert.config.schema import ConfigError
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.gap_heads import HEADS, GapClassifier
from sparsebert.trainer.arguments import training_arguments

TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, type_vocab_size=2)


@pytest.fixture
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def test_train_ddp_section_reaches_training_arguments(registry, tmp_path):
    cfg = registry.build("bert_tiny_quick", ["train.ddp.bucket_cap_mb=50", "train.ddp.static_graph=true"])
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x")
    assert args.ddp_find_unused_parameters is False  # Trainer's own default would be True for these models
    assert args.ddp_broadcast_buffers is False
    assert args.ddp_bucket_cap_mb == 50
    assert args.ddp_static_graph is True


def test_one_process_seeing_several_gpus_trains_on_one(registry, tmp_path, caplog):
    """What TrainingArguments computes for one process that sees 2 GPUs (n_gpu 2: nn.DataParallel, twice the
    batch) is taken back to one device; tests/gpu checks it on 2 real GPUs."""
    from sparsebert.trainer.arguments import one_gpu_per_process

    cfg = registry.build("bert_tiny_quick", ["train.global_batch_size=8"])
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x")
    assert args.n_gpu in (0, 1) and args.train_batch_size == 8
    args._n_gpu = 2  # as TrainingArguments sets it on a 2-GPU machine without a launcher
    assert args.train_batch_size == 16
    with caplog.at_level("WARNING", logger="sparsebert.trainer.arguments"):
        one_gpu_per_process(args)
    assert args.n_gpu == 1 and args.train_batch_size == 8
    assert "2 GPUs are visible to this one process" in caplog.text and "--gpus N" in caplog.text


def test_bad_bucket_size_is_refused(registry):
    with pytest.raises(ConfigError, match="train.ddp.bucket_cap_mb"):
        registry.build("bert_tiny_quick", ["train.ddp.bucket_cap_mb=0"])


def unused(model: torch.nn.Module, loss: torch.Tensor) -> list[str]:
    loss.backward()
    return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]


def batch(n: int = 3, length: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(5, 60, (n, length), generator=g),
            "attention_mask": torch.ones(n, length, dtype=torch.long),
            "token_type_ids": torch.zeros(n, length, dtype=torch.long)}


def test_mlm_model_uses_every_parameter():
    torch.manual_seed(0)
    model = BertForMaskedLMAtMasked(BertConfig(**TINY))
    labels = torch.full((3, 10), -100)
    labels[:, 2] = 7
    assert unused(model, model(**batch(), labels=labels).loss) == []


def test_glue_and_squad_models_use_every_parameter():
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(BertConfig(**TINY, num_labels=2))
    assert unused(classifier, classifier(**batch(), labels=torch.tensor([0, 1, 1])).loss) == []
    qa = BertForQuestionAnswering(BertConfig(**TINY))
    positions = torch.tensor([1, 2, 3])
    assert unused(qa, qa(**batch(), start_positions=positions, end_positions=positions + 1).loss) == []


@pytest.mark.parametrize("head", HEADS)
def test_gap_heads_use_every_parameter(head):
    torch.manual_seed(0)
    model = GapClassifier(BertModel(BertConfig(**TINY)), head)  # the pooler, which no head reads, is dropped
    assert not any(n.startswith("encoder.pooler.") for n, _ in model.named_parameters())
    b = batch()
    b.update(p_idx=torch.tensor([7, 7, 7]), a_idx=torch.tensor([2, 2, 2]), b_idx=torch.tensor([4, 4, 4]))
    assert unused(model, model(**b, labels=torch.tensor([0, 1, 2])).loss) == []


def tiny_trainer(registry, tmp_path, overrides: list[str]):
    """SparseBertTrainer over a tiny MLM model, with bert_tiny_quick's sections plus ``overrides``."""
    from sparsebert.models.prepare import prepare_model
    from sparsebert.trainer.hooks import build_hooks
    from sparsebert.trainer.trainer import SparseBertTrainer

    cfg = registry.build("bert_tiny_quick", overrides)
    model = prepare_model(BertForMaskedLMAtMasked(BertConfig(**TINY)), cfg)
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    return SparseBertTrainer(model=model, args=args, **build_hooks(cfg, model, 10, cfg.seed))


def test_bucket_view_and_comm_hook_reach_accelerate(registry, tmp_path):
    """The two settings TrainingArguments cannot carry are set on the handler Accelerate wraps the model with."""
    from accelerate.utils import DDPCommunicationHookType

    handler = tiny_trainer(registry, tmp_path, ["train.ddp.comm_hook=fp16"]).accelerator.ddp_handler
    assert handler.gradient_as_bucket_view is True
    assert handler.comm_hook == DDPCommunicationHookType.FP16
    assert handler.find_unused_parameters is False
    assert handler.bucket_cap_mb == 25


@pytest.mark.parametrize("hook", ["sparse", "flat", "flat_bf16"])
def test_flat_all_reduce_is_sparsebert_s_own_and_warns_where_it_was_not_measured(registry, tmp_path, caplog, hook):
    """Accelerate registers no hook for it (a callback builds sparsebert's sync); a whole-model graph is not split
    for it by default (the sync runs after the backward, there is nothing to overlap); eager, per-layer and split
    runs tell the user what was measured."""
    import torch._dynamo
    from accelerate.utils import DDPCommunicationHookType

    from sparsebert.trainer.ddp import FlatAllReduceCallback

    sparse = ["sparsity.sparsity=0.8", f"train.ddp.comm_hook={hook}"]
    compiled = "train.torch_compile=true"
    for settings, warned in (([compiled], False), ([], True), ([compiled, "train.torch_compile_scope=layers"], True),
                             ([compiled, "train.ddp.split_compiled_graphs=true"], True)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="sparsebert.trainer.ddp"):
            trainer = tiny_trainer(registry, tmp_path, [*sparse, *settings])
        assert ("measured with one whole-model compiled graph only" in caplog.text) == warned, settings
        assert trainer.accelerator.ddp_handler.comm_hook == DDPCommunicationHookType.NO
        callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, FlatAllReduceCallback)]
        assert len(callbacks) == 1 and callbacks[0].comm_hook == hook and callbacks[0].pieces == 3  # the default
        assert trainer.gradient_sync is None  # built at the start of training, for a DDP model only
        if settings == [compiled]:
            assert torch._dynamo.config.optimize_ddp is False
    trainer = tiny_trainer(registry, tmp_path, [*sparse, compiled, "train.ddp.flat_pieces=2"])
    callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, FlatAllReduceCallback)]
    assert callbacks[0].pieces == 2  # an explicit value reaches the sync


def test_split_compiled_graphs_sets_dynamos_ddp_optimizer_both_ways(registry, tmp_path):
    """Process-wide: each trainer sets it, so an experiment after a nosplit one gets the default back."""
    import torch._dynamo

    tiny_trainer(registry, tmp_path, ["train.ddp.split_compiled_graphs=false"])
    assert torch._dynamo.config.optimize_ddp is False
    tiny_trainer(registry, tmp_path, [])
    assert torch._dynamo.config.optimize_ddp is True
    # unset: no split where each layer is compiled on its own (the layers separate the buckets already)
    tiny_trainer(registry, tmp_path, ["train.torch_compile=true", "train.torch_compile_scope=layers"])
    assert torch._dynamo.config.optimize_ddp is False
    tiny_trainer(registry, tmp_path, ["train.torch_compile=true", "train.torch_compile_scope=layers",
                                      "train.ddp.split_compiled_graphs=true"])
    assert torch._dynamo.config.optimize_ddp is True


def test_kernel_tuning_sets_inductor_for_the_process_both_ways(registry, tmp_path, monkeypatch):
    """train.torch_compile_tune_kernels reaches Inductor; the next compiled experiment in the process gets its own
    setting back, and a run that compiles nothing leaves Inductor alone."""
    import torch._inductor.config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", raising=False)
    # the config's own patch restores the setting afterwards (monkeypatch would delete the config key on undo)
    with inductor.patch(coordinate_descent_tuning=False):
        tiny_trainer(registry, tmp_path, ["train.torch_compile=true", "train.torch_compile_tune_kernels=true"])
        assert inductor.coordinate_descent_tuning is True
        tiny_trainer(registry, tmp_path, [])
        assert inductor.coordinate_descent_tuning is True
        tiny_trainer(registry, tmp_path, ["train.torch_compile=true"])
        assert inductor.coordinate_descent_tuning is False
        # off means the process's default: Inductor's own environment variable still turns it on
        monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")
        tiny_trainer(registry, tmp_path, ["train.torch_compile=true"])
        assert inductor.coordinate_descent_tuning is True
    assert hasattr(inductor, "coordinate_descent_tuning")


def test_kernel_tuning_without_compile_is_refused(registry):
    with pytest.raises(ConfigError, match="torch_compile_tune_kernels .* needs train.torch_compile=true"):
        registry.build("bert_tiny_quick", ["train.torch_compile_tune_kernels=true"])


def test_bf16_all_reduce_without_cuda_is_a_clear_error(registry, tmp_path):
    from sparsebert.errors import SparseBertError

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    with pytest.raises(SparseBertError, match="comm_hook=bf16 needs CUDA"):
        tiny_trainer(registry, tmp_path, ["train.ddp.comm_hook=bf16"])


def test_cached_flop_count_equals_the_trainers(registry, tmp_path):
    from transformers import Trainer

    ours = tiny_trainer(registry, tmp_path, [])
    inputs = batch()
    expected = Trainer.floating_point_ops(ours, inputs)
    assert expected > 0 and ours.floating_point_ops(inputs) == ours.floating_point_ops(inputs) == expected


MATMUL_PRECISION_SCENARIO = """
import sys
import torch
from sparsebert.config import ExperimentRegistry
from sparsebert.trainer.arguments import training_arguments

# what transformers does for a compiled bf16 run on a GPU (enable_tf32 through the new API); Inductor's matmul
# autotuning then reads the precision through the legacy getter, which raised and failed the compile
torch.backends.fp32_precision = "tf32"
try:
    torch.get_float32_matmul_precision()
    print("getter readable before")
except RuntimeError as e:
    print("getter raised before:", "mix of the legacy and new APIs" in str(e))
cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", ["train.torch_compile=true"])
training_arguments(cfg.train, sys.argv[1], cfg.seed, "x")
print("after:", torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision)
"""


def test_compiled_run_leaves_matmul_precision_readable(tmp_path):
    """In a fresh interpreter: torch's precision state is process-wide, and once any earlier test (or a compiled
    run on a GPU) has set it through the legacy API, the new API's setting no longer makes the getter raise."""
    done = subprocess.run([sys.executable, "-c", MATMUL_PRECISION_SCENARIO, str(tmp_path)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "getter raised before: True" in lines  # the state that failed compiles
    assert "after: high tf32" in lines  # readable now, and TF32 stays on


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No wandb settings, and HOME in tmp_path (its .netrc the test writes)."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def wandb_mode(registry, run_dir: Path) -> str | None:
    cfg = registry.build("bert_tiny_quick", ["train.report_to=wandb"])
    training_arguments(cfg.train, run_dir, 0, "run")
    return os.environ.get("WANDB_MODE")


@pytest.mark.parametrize("netrc_text, mode", [
    (None, "offline"),  # no credentials at all
    ("machine api.wandb.ai\n  login user\n  password 0123abcd\n", None),  # after wandb login: online
    ("machine github.com login user password x\n", "offline"),  # other hosts' entries only
    ("machine api.wandb.ai login\n", "offline"),  # broken netrc: no credentials, no crash
    (b"\xff\xfe\x00garbage", "offline"),
])
def test_wandb_goes_offline_only_without_credentials(registry, wandb_env, netrc_text, mode):
    netrc = wandb_env / ".netrc"
    if isinstance(netrc_text, bytes):
        netrc.write_bytes(netrc_text)
    elif netrc_text is not None:
        netrc.write_text(netrc_text)
    assert wandb_mode(registry, wandb_env / "run") == mode


def test_wandb_key_netrc_variable_host_and_user_mode(registry, wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_mode(registry, wandb_env / "run") is None
    monkeypatch.delenv("WANDB_API_KEY")
    other = wandb_env / "elsewhere.netrc"  # $NETRC, for a self-hosted server named by WANDB_BASE_URL
    other.write_text("machine wandb.example.org login user password k\n")
    monkeypatch.setenv("NETRC", str(other))
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_mode(registry, wandb_env / "run") is None
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the user's choice stays, with credentials or without
    monkeypatch.delenv("NETRC")
    assert wandb_mode(registry, wandb_env / "run") == "disabled"


class _RowsSayingWhoReadThem(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.full((4,), 5), "labels": torch.full((4,), -100), "pid": os.getpid()}


@pytest.mark.parametrize("workers", [2, 0])
def test_loader_workers_outlive_an_epoch(registry, tmp_path, workers):
    """The training loader keeps its worker processes from one epoch to the next: starting new ones at
    every epoch boundary stalled the step, and a multi-GPU run over a small corpus ends its epochs N times as often
    (docs/performance.md, real-loop scaling). Without workers the loader reads in this process, as before."""
    trainer = tiny_trainer(registry, tmp_path, [f"train.dataloader_workers={workers}", "train.global_batch_size=4"])
    trainer.train_dataset = _RowsSayingWhoReadThem()
    loader = trainer.get_train_dataloader()
    readers = [{int(pid) for batch in loader for pid in batch["pid"]} for _epoch in range(2)]
    assert trainer.args.dataloader_persistent_workers is False  # evaluation loaders start their own, as before
    if workers:
        assert len(readers[0]) == 2 and os.getpid() not in readers[0]
        assert readers[1] == readers[0]  # the same two processes read the second epoch
    else:
        assert readers == [{os.getpid()}, {os.getpid()}]


class _MaskedRows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.full((4,), 5), "labels": torch.full((4,), 5)}


def test_training_loader_workers_stop_when_train_returns(registry, tmp_path):
    """The workers that outlive epochs are stopped as train() returns, not left to the garbage collector, which
    waited out torch's 5 s join timeout per worker at the end of every run."""
    from transformers import TrainerCallback

    trainer = tiny_trainer(registry, tmp_path, ["train.dataloader_workers=2", "train.global_batch_size=4",
                                                "train.max_steps=2"])
    trainer.train_dataset = _MaskedRows()
    workers = []

    class SeeWorkers(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            workers[:] = trainer._train_loader._iterator._workers

    trainer.add_callback(SeeWorkers())
    trainer.train()
    assert len(workers) == 2 and not any(w.is_alive() for w in workers)
