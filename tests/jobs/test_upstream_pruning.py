"""Task upstream on CPU: MiniLM's first 2 layers pruned on 2 real Wikipedia files while distilling its dense self,
then finetuned on RTE with the masks fixed (the transfer keeps the upstream model's zeros, bit for bit)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel

from sparsebert.config import ConfigError, ExperimentRegistry
from sparsebert.jobs.upstream_pruning import EncoderDistillation
from sparsebert.results import RunRegistry
from sparsebert.runner import RunOptions, run_experiment
from sparsebert.sparsity import DEFAULT_INCLUDE
from sparsebert.trainer.distillation import attention_loss

pytestmark = pytest.mark.slow

# 12 optimizer steps of 8 blocks of 64 tokens; pruning every 2 steps to 80 % by step 8 (end_fraction 0.7)
SMALL = ["train.max_steps=12", "train.global_batch_size=8", "data.max_seq_length=64", "train.eval_steps=6",
         "train.save_steps=6", "gmp.frequency=2", "data.max_eval_samples=16"]
FEW_ROWS = ["finetune.max_train_samples=32", "finetune.max_eval_samples=32"]


def encoder_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The exported tensors under their BertModel names (a task model's ``bert.`` prefix dropped)."""
    weights = load_file(str(model_dir / "model.safetensors"))
    return {name.removeprefix("bert."): t for name, t in weights.items()}


def selected(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import re

    return {n: t for n, t in weights.items() if any(re.search(p, n) for p in DEFAULT_INCLUDE)}


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


@pytest.fixture(scope="module")
def root(registry, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("upstream")
    opts = RunOptions(output_root=out, data_dir=data_dir)
    # without dropout, as minilm_upstream_sparse80_obs_nodropout: the transfer must still finetune with MiniLM's
    run_experiment(registry.build("tiny_upstream", SMALL + ["model.hidden_dropout=0", "model.attention_dropout=0"]),
                   opts)
    run_experiment(registry.build("tiny_glue", FEW_ROWS + ["finetune.glue_tasks=rte", "finetune.runs_per_task={}"]),
                   opts)
    run_experiment(registry.build("tiny_glue_from_upstream", FEW_ROWS), opts)
    return out


def test_upstream_run_prunes_the_encoder_and_starts_at_distance_zero(root, minilm_path):
    run = root / "tiny_upstream"
    metrics = json.loads((run / "metrics.json").read_text())
    assert (run / "DONE").is_file() and metrics["global_step"] == 12
    assert metrics["initial_eval_loss"] == 0.0  # the student is its teacher before the first step
    assert 0.0 < metrics["eval_loss"] < 1.0 and "perplexity" not in metrics
    student = encoder_weights(run / "model")
    layers = selected(student)
    assert len(layers) == 12  # 2 layers x Q, K, V, O, FFN in, FFN out
    zeros = sum(int((t == 0).sum()) for t in layers.values())
    assert zeros / sum(t.numel() for t in layers.values()) == pytest.approx(0.8, abs=1e-4)
    # the pooler sees no loss and is exported as it came; the student loads as a plain BertModel
    original = load_file(str(Path(minilm_path) / "model.safetensors"))
    assert torch.equal(student["pooler.dense.weight"], original["pooler.dense.weight"])
    assert BertModel.from_pretrained(str(run / "model")).config.num_hidden_layers == 2
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "upstream" and config["sparsity"]["sparsity"] == 0.8


def test_transfer_keeps_the_upstream_zeros_bit_for_bit(root):
    upstream = selected(encoder_weights(root / "tiny_upstream" / "model"))
    run = root / "tiny_glue_from_upstream" / "glue_rte" / "run0"
    assert (run / "DONE").is_file()
    finetuned = selected(encoder_weights(run / "model"))
    assert finetuned.keys() == upstream.keys()
    for name, weight in upstream.items():
        assert torch.equal(finetuned[name] == 0, weight == 0), name
        assert not torch.equal(finetuned[name], weight), f"{name} did not train"
    report = json.loads((run / "sparsity.json").read_text())
    assert report["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-4)
    # the upstream run trained without dropout; its transfer finetunes with MiniLM's 0.1 again
    for model_dir, dropout in ((root / "tiny_upstream" / "model", 0.0), (run / "model", 0.1)):
        config = json.loads((model_dir / "config.json").read_text())
        assert (config["hidden_dropout_prob"], config["attention_probs_dropout_prob"]) == (dropout, dropout)
    # the upstream run's eval loss is a distance to its teacher: not recorded as the model's MLM loss
    (row,) = RunRegistry.in_output_root(root).runs(experiments=["tiny_glue_from_upstream"])
    assert row.pretrain_metrics == {}


def tiny_bert(seed: int, attn: str = "eager") -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    config._attn_implementation = attn
    return BertModel(config).eval()


def test_encoder_distillation_keeps_the_teacher_out_of_the_module():
    teacher = tiny_bert(0)
    model = EncoderDistillation(tiny_bert(0), teacher, hidden_weight=1.0, attention_weight=1.0)
    assert all(name.startswith("student.") for name in model.state_dict())
    assert all(name.startswith("student.") for name, _ in model.named_parameters())
    ids = torch.randint(0, 50, (3, 10))
    assert model(input_ids=ids).loss.item() == 0.0  # the same weights: no distance
    with torch.no_grad():  # other attention and another layer output
        layer = model.student.encoder.layer[0]
        layer.attention.self.query.weight.add_(torch.randn_like(layer.attention.self.query.weight) * 5)
        layer.output.dense.weight.add_(0.5)
    loss = model(input_ids=ids).loss
    loss.backward()
    assert loss.item() > 0 and all(p.grad is None for p in teacher.parameters())


def test_attention_loss_is_a_kl_that_ignores_padded_queries():
    teacher = torch.softmax(torch.randn(2, 2, 4, 4), dim=-1)
    student = torch.softmax(torch.randn(2, 2, 4, 4), dim=-1)
    assert attention_loss((teacher,), (teacher,)).item() == pytest.approx(0.0, abs=1e-6)
    manual = (teacher * (teacher.log() - student.log())).sum(-1).mean()
    assert attention_loss((student,), (teacher,)).item() == pytest.approx(manual.item(), rel=1e-5)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    changed = student.clone()
    changed[1, :, 2:] = teacher[1, :, 2:]  # the padded query rows of example 1 only
    assert attention_loss((changed,), (teacher,), mask).item() == pytest.approx(
        attention_loss((student,), (teacher,), mask).item(), rel=1e-6)


@pytest.mark.parametrize("sets, message", [
    (["kd.hidden_weight=0"], "kd.hidden_weight and/or kd.attention_weight"),
    (["kd.attention_weight=1"], "model.attn_implementation=eager"),
    (["kd.attention_weight=1", "model.attn_implementation=eager"], "set model.attention_dropout=0"),
    (["data.static_mask_count=true"], "task upstream masks no tokens"),
])
def test_upstream_settings_are_refused_before_anything_runs(registry, sets, message):
    with pytest.raises(ConfigError, match=message):
        registry.build("tiny_upstream", sets)


def test_the_glue_transfer_variants_change_their_one_setting(registry):
    """The study's STUDY_VARIANTS lanes (scripts/upstream_study.sh): each variant differs from the plain transfer
    in the one setting its name says."""
    plain = registry.build("minilm_glue_from_upstream80_obs", [])
    hidden = registry.build("minilm_glue_from_upstream80_obs_hidden", [])
    faster = registry.build("minilm_glue_from_upstream80_obs_lr2e4", [])
    assert (plain.kd.hidden_weight, hidden.kd.hidden_weight) == (0.0, 1.0)
    assert (plain.train.learning_rate, faster.train.learning_rate) == (1e-4, 2e-4)
    assert hidden.train == plain.train and faster.kd == plain.kd


def test_the_searched_glue_transfer_changes_only_what_the_search_chose(registry):
    """The CoLA search's best trial (docs/results.md, call I) on the shipped 80 % transfer: its space's four
    settings, nothing else."""
    shipped = registry.build("minilm_glue_sparse80", [])
    searched = registry.build("minilm_glue_from_upstream80_obs_nodropout_searched", [])
    assert (searched.train.learning_rate, searched.train.epochs) == (7e-5, 16)
    assert (searched.kd.alpha, searched.kd.temperature) == (0.5, 1.2)
    same_elsewhere = dataclasses.replace(searched, name=shipped.name, description=shipped.description,
                                         train=shipped.train, kd=shipped.kd)
    assert same_elsewhere == shipped
    assert dataclasses.replace(searched.train, learning_rate=1e-4, epochs=8) == shipped.train
    assert dataclasses.replace(searched.kd, alpha=1.0, temperature=2.0) == shipped.kd


def test_the_attention_term_is_for_upstream_only(registry):
    with pytest.raises(ConfigError, match="kd.attention_weight is for task upstream"):
        registry.build("tiny_glue_sparse80", ["kd.attention_weight=1", "model.attn_implementation=eager"])


def test_with_the_attention_term_each_term_is_an_eval_metric_of_its_own(tmp_path):
    """The Trainer's eval loss is the weighted sum; eval_layer_distance and eval_attention_kl are the two terms'
    means over the held-out examples (11 of them: the last batch of 4 is short), and the loss is their weighted sum."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    from sparsebert.jobs.upstream_pruning import distillation_terms

    student, teacher = tiny_bert(1, attn="eager"), tiny_bert(0, attn="eager")
    model = EncoderDistillation(student, teacher, hidden_weight=2.0, attention_weight=0.5)
    blocks = Dataset.from_dict({"input_ids": torch.randint(0, 50, (11, 12)).tolist()})
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
                             label_names=[])
    metrics = Trainer(model=model, args=args, eval_dataset=blocks, data_collator=default_data_collator,
                      compute_metrics=distillation_terms).evaluate()
    with torch.no_grad():
        ids = torch.tensor(blocks["input_ids"])
        whole = model(input_ids=ids)
    distance, kl = whole.terms[0].tolist()
    assert distance > 0 and kl > 0
    assert metrics["eval_layer_distance"] == pytest.approx(distance, rel=1e-5)
    assert metrics["eval_attention_kl"] == pytest.approx(kl, rel=1e-5)
    assert metrics["eval_loss"] == pytest.approx(2.0 * distance + 0.5 * kl, rel=1e-5)


@pytest.mark.parametrize("level, upstream", [(80, "minilm_upstream_sparse80_obs_nodropout"),
                                             (90, "minilm_upstream_sparse90_obs")])
def test_each_level_ships_one_upstream_model_that_every_task_starts_from(registry, level, upstream):
    """Prune once, transfer to every task (docs/results.md): every family's shipped recipe at a level starts from
    the same upstream run, finetunes with MiniLM's own dropout and distils from its own dense run."""
    for family, dense in (("glue", "minilm_glue"), ("squad_v1", "minilm_squad_v1"), ("gap_mul", "minilm_gap_mul"),
                          ("gap_concat", "minilm_gap_concat")):
        shipped = registry.build(f"minilm_{family}_sparse{level}", [])
        assert (shipped.model.init_from, shipped.kd.teacher) == (upstream, dense)
        assert (shipped.model.hidden_dropout, shipped.model.attention_dropout) == (0.1, 0.1)


@pytest.mark.parametrize("level", [80, 90])
def test_the_attention_term_builds_on_the_run_without_dropout(registry, level):
    """The variant differs from the upstream run without dropout (shipped at 80 %) only in the attention term."""
    base = registry.build(f"minilm_upstream_sparse{level}_obs_nodropout", [])
    attn = registry.build(f"minilm_upstream_sparse{level}_obs_attn", [])
    assert (base.model.hidden_dropout, base.model.attention_dropout) == (0.0, 0.0)
    assert (attn.kd.attention_weight, attn.model.attn_implementation) == (1.0, "eager")
    assert attn.gmp == base.gmp and attn.train == base.train and attn.sparsity == base.sparsity
