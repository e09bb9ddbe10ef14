"""GapClassifier heads: shapes and gradients on a tiny random BERT, safetensors/Trainer round trips, and a few
optimizer steps on real GAP rows with the real MiniLM encoder."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, BertConfig, BertModel

from sparsebert.data.gap import featurize_gap, read_gap
from sparsebert.errors import SparseBertError
from sparsebert.models.gap_heads import GapClassifier

HEADS = ["concat", "mul", "segment"]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """On a small shared CPU, 2 OpenMP threads competing with another process ran these steps ~20x slower
    (18 s vs 0.8 s per head); one thread is fast and steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_encoder() -> BertModel:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, type_vocab_size=2,
    )  # fmt: skip
    return BertModel(cfg)


def tiny_batch(n: int = 4, length: int = 12, segment: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    types = torch.zeros(n, length, dtype=torch.long)
    if segment:
        types[:, 2], types[:, 4], types[:, 7] = 2, 3, 1
    return {
        "input_ids": torch.randint(1, 50, (n, length), generator=g),
        "attention_mask": torch.ones(n, length, dtype=torch.long),
        "token_type_ids": types,
        "p_idx": torch.full((n,), 7),
        "a_idx": torch.full((n,), 2),
        "b_idx": torch.full((n,), 4),
        "labels": torch.tensor([0, 1, 2, 0])[:n],
    }


@pytest.mark.parametrize("head", HEADS)
def test_forward_backward_tiny(head):
    model = GapClassifier(tiny_encoder(), head)
    out = model(**tiny_batch(segment=head == "segment"))
    assert out.logits.shape == (4, 3)
    assert out.loss is not None and torch.isfinite(out.loss)
    out.loss.backward()
    head_params = [p for n, p in model.named_parameters() if not n.startswith("encoder.")]
    assert head_params and all(p.grad is not None and p.grad.abs().sum() > 0 for p in head_params)
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    batch = tiny_batch(segment=head == "segment")
    del batch["labels"]
    assert model(**batch).loss is None


def test_segment_head_enlarges_token_types():
    encoder = tiny_encoder()
    row0 = encoder.embeddings.token_type_embeddings.weight[0].detach().clone()
    model = GapClassifier(encoder, "segment")
    table = model.encoder.embeddings.token_type_embeddings.weight
    assert table.shape == (4, 32) and model.encoder.config.type_vocab_size == 4
    assert torch.equal(table.detach(), row0.expand(4, -1))
    # the marker rows are used (and trained) exactly when the batch marks P / A / B
    model(**tiny_batch()).loss.backward()
    assert table.grad[0].abs().sum() > 0 and table.grad[1:].abs().sum() == 0
    table.grad = None
    model(**tiny_batch(segment=True)).loss.backward()
    assert all(table.grad[i].abs().sum() > 0 for i in range(4))
    # a second GapClassifier over the same encoder keeps the (trained) 4-row table
    trained = table.detach().clone()  # a copy: an in-place reset of the same tensor must show
    again = GapClassifier(model.encoder, "segment")
    assert torch.equal(again.encoder.embeddings.token_type_embeddings.weight.detach(), trained)


def test_unknown_head():
    with pytest.raises(SparseBertError, match="unknown head"):
        GapClassifier(tiny_encoder(), "sum")


@pytest.mark.parametrize("head", HEADS)
def test_safetensors_round_trip(head, tmp_path):
    """What the Trainer does for a non-PreTrainedModel: save_file(state_dict) — fails on shared tensors."""
    model = GapClassifier(tiny_encoder(), head).eval()
    save_file(model.state_dict(), tmp_path / "model.safetensors", metadata={"format": "pt"})
    fresh = GapClassifier(tiny_encoder(), head).eval()
    torch.nn.init.normal_(fresh.encoder.embeddings.word_embeddings.weight)
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"))
    batch = tiny_batch(segment=head == "segment")
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, fresh(**batch).logits)


def test_trainer_train_save_predict(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = GapClassifier(tiny_encoder(), "mul")
    batch = tiny_batch()
    rows = [{k: v[i] for k, v in batch.items()} for i in range(4)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, per_device_eval_batch_size=4,
        label_names=["labels"], report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
    trainer.train()
    pred = trainer.predict(rows)
    assert pred.predictions.shape == (4, 3) and list(pred.label_ids) == [0, 1, 2, 0]
    trainer.save_model(str(tmp_path / "final"))
    state = load_file(tmp_path / "final" / "model.safetensors")
    assert torch.equal(state["neither"], model.neither.detach())


@pytest.fixture(scope="module")
def real_batch(asset_data_dir, tokenizer):
    # the first rows of the real validation file, as checked in (tests/assets)
    rows = read_gap(asset_data_dir / "gap" / "gap-validation.tsv")[:4]
    assert [r.label for r in rows] == [2, 1, 1, 0]
    out = {}
    for head in HEADS:
        # 64 tokens (a window around the mentions) keeps the CPU steps short
        feats = featurize_gap(rows, tokenizer, 64, head)
        out[head] = {k: torch.tensor(v) for k, v in feats.items() if not k.endswith("_end")}
    return out


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return AutoModel.from_pretrained(minilm_path)


def test_from_pretrained_encoder(minilm_path):
    model = GapClassifier.from_pretrained_encoder(minilm_path, "concat", dropout=0.2)
    assert model.encoder.config.hidden_size == 384 and model.dropout.p == 0.2
    assert model.classifier.in_features == 3 * 384


def test_real_segment_model_saves_with_safetensors(minilm, tmp_path):
    model = GapClassifier(copy.deepcopy(minilm), "segment")
    save_file(model.state_dict(), tmp_path / "model.safetensors", metadata={"format": "pt"})
    state = load_file(tmp_path / "model.safetensors")
    assert state["encoder.embeddings.token_type_embeddings.weight"].shape == (4, 384)
    assert set(state) == set(model.state_dict())


@pytest.mark.parametrize("head", HEADS)
def test_real_minilm_learns_four_rows(head, minilm, real_batch):
    torch.manual_seed(0)
    model = GapClassifier(copy.deepcopy(minilm), head, dropout=0.0)
    model.eval()  # no dropout: the loss comparison is deterministic
    # the 30522-row word embedding table dominates optimizer time on CPU; everything else trains
    model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    batch = real_batch[head]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    losses = []
    for _ in range(3):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = model(**batch).loss.item()
    assert final < losses[0] * 0.8, (losses, final)


def test_a_saved_run_with_fewer_layers_than_its_encoder_source_loads_back(minilm_path, tmp_path):
    """A GAP run with model.num_layers=2 saves a 2-layer state dict; the loader builds the encoder from the
    6-layer source's config with as many layers as the weights have, and every weight comes back."""
    from sparsebert.jobs.finetune.gap import load_gap_model

    model = GapClassifier.from_pretrained_encoder(minilm_path, "mul", encoder_kwargs={"num_hidden_layers": 2})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    loaded = load_gap_model(tmp_path, "mul", minilm_path)
    assert loaded.encoder.config.num_hidden_layers == 2
    assert all(loaded.state_dict()[k].equal(v) for k, v in model.state_dict().items())
